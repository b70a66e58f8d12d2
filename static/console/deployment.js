// The deployment page's live parts: status badge and charts (uPlot) from the REST API, read with the session
// cookie: GET /api/v1/deployments/<id>/ and GET /api/v1/deployments/<id>/metrics?window=<s>. The time range
// selector sets the window; "Refresh every 5 s" turns the polling on or off.
(function () {
  "use strict";
  const root = document.getElementById("charts");
  const id = root.dataset.deployment;
  const rangeSelect = document.getElementById("metrics-window");
  const auto = document.getElementById("metrics-auto");
  const api = `/api/v1/deployments/${id}/`;
  const charts = window.conchCharts;
  const ms = (us) => (us === null || us === undefined ? null : us / 1000);

  const views = {
    throughput: charts.timeSeries(document.getElementById("chart-throughput"), [
      { label: "inferences/s" }, { label: "requests/s" },
    ]),
    latency: charts.timeSeries(document.getElementById("chart-latency"), [
      { label: "p50 ms", digits: 1 }, { label: "p99 ms", digits: 1 }, { label: "average ms", digits: 1 },
    ]),
    time: charts.timeSeries(document.getElementById("chart-time"), [
      { label: "queue ms", digits: 2 }, { label: "compute ms", digits: 2 },
    ]),
    batch: charts.timeSeries(document.getElementById("chart-batch"), [{ label: "batch size" }]),
    failures: charts.timeSeries(document.getElementById("chart-failures"), [
      { label: "failures", digits: 0, color: "#b91c1c" },
    ]),
  };

  function column(points, key, scale) {
    return points.map((p) => {
      // A step without samples has no value: a gap, not zero.
      if (p.samples === 0) return null;
      const v = p[key];
      if (v === null || v === undefined) return null;
      return scale ? scale(v) : v;
    });
  }

  function summarize(model) {
    const summary = document.getElementById("summary");
    summary.textContent = "";
    if (!model) {
      summary.textContent = "No metric samples in this range yet.";
      return;
    }
    // Averages over the whole range (or since the deployment was created, when that is later), idle time
    // included: a burst of traffic reads lower here than at its peak on the chart. With no request in the range
    // the per-request averages have nothing to average: a dash, not 0.
    const served = model.request_count > 0;
    const ms = (us) => (served ? `${(us / 1000).toFixed(2)} ms` : "—");
    const parts = [
      ["Average throughput", model.throughput_inferences_per_second === null
        ? "unknown (one sample so far)" : `${model.throughput_inferences_per_second.toFixed(2)} inf/s`],
      ["Requests", `${model.request_count}`],
      ["Average latency", ms(model.average_request_latency_us)],
      ["Queue", ms(model.average_queue_time_us)],
      ["Compute", ms(model.average_compute_time_us)],
      ["Batch size", served ? model.average_batch_size.toFixed(2) : "—"],
      ["Failures", String(model.failures)],
    ];
    const over = document.createElement("span");
    over.textContent = "Over the time range (or since the deployment was created):";
    summary.appendChild(over);
    for (const [name, value] of parts) {
      const span = document.createElement("span");
      span.textContent = `${name}: ${value}`;
      summary.appendChild(span);
    }
  }

  async function getJson(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    return response.json();
  }

  async function refreshStatus() {
    const body = await getJson(api);
    const badge = document.getElementById("status");
    badge.textContent = body.status;
    badge.className = `status status-${body.status}`;
    document.getElementById("status-message").textContent = body.status_message || "";
    document.getElementById("restart-count").textContent = String(body.restart_count);
    const error = document.getElementById("error");
    error.textContent = body.error || "";
    error.hidden = !body.error;
    document.getElementById("endpoint-http").textContent = body.endpoints.http || "—";
  }

  async function refreshCharts() {
    try {
      const body = await getJson(`${api}metrics?window=${rangeSelect.value}`);
      const points = body.series.length ? body.series[0].points : [];
      const times = points.map((p) => Date.parse(p.time) / 1000);
      views.throughput.update(times, [
        column(points, "throughput_inferences_per_second"), column(points, "requests_per_second"),
      ]);
      views.latency.update(times, [
        column(points, "request_p50_us", ms), column(points, "request_p99_us", ms),
        column(points, "average_request_latency_us", ms),
      ]);
      views.time.update(times, [
        column(points, "average_queue_time_us", ms), column(points, "average_compute_time_us", ms),
      ]);
      views.batch.update(times, [column(points, "average_batch_size")]);
      views.failures.update(times, [column(points, "failures")]);
      summarize(body.models[0]);
    } catch (err) {
      document.getElementById("summary").textContent = `Could not load metrics: ${err.message}`;
    }
  }

  function refresh() {
    refreshStatus().catch(() => {});
    refreshCharts();
  }

  let timer = null;
  function schedule() {
    if (timer) clearInterval(timer);
    timer = auto.checked ? setInterval(refresh, 5000) : null;
  }
  rangeSelect.addEventListener("change", refreshCharts);
  auto.addEventListener("change", schedule);
  refresh();
  schedule();
})();
