// Live throughput/latency charts of one deployment, drawn as SVG polylines from
// GET /api/v1/deployments/<id>/metrics (session-authenticated), refreshed every 5 s.
(function () {
  "use strict";
  const script = document.currentScript;
  const id = script.dataset.deployment;
  const windowSeconds = 300;
  const svgNs = "http://www.w3.org/2000/svg";

  function draw(svg, allPoints, key) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    // A step without samples (or, for latency, without requests) has a null value: no data, not zero.
    const points = allPoints.filter(p => p[key] !== null);
    const width = 600, height = 180, pad = 30;
    if (points.length === 0) {
      const text = document.createElementNS(svgNs, "text");
      text.setAttribute("x", 20); text.setAttribute("y", 90);
      text.textContent = "no samples in the window yet";
      svg.appendChild(text);
      return;
    }
    const times = points.map(p => Date.parse(p.time));
    const values = points.map(p => p[key]);
    const t0 = Math.min(...times), t1 = Math.max(...times, t0 + 1);
    const vmax = Math.max(...values, 1e-9);
    const xy = points.map((p, i) => [
      pad + (times[i] - t0) / (t1 - t0) * (width - 2 * pad),
      height - pad - values[i] / vmax * (height - 2 * pad),
    ]);
    const line = document.createElementNS(svgNs, "polyline");
    line.setAttribute("points", xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#1f6fb2");
    line.setAttribute("stroke-width", "2");
    svg.appendChild(line);
    // A dot per point: a single point (one interval with requests) draws no line.
    for (const [x, y] of xy) {
      const dot = document.createElementNS(svgNs, "circle");
      dot.setAttribute("cx", x.toFixed(1)); dot.setAttribute("cy", y.toFixed(1)); dot.setAttribute("r", "3");
      dot.setAttribute("fill", "#1f6fb2");
      svg.appendChild(dot);
    }
    const label = document.createElementNS(svgNs, "text");
    label.setAttribute("x", 4); label.setAttribute("y", 14); label.setAttribute("font-size", "12");
    label.textContent = `max ${vmax.toFixed(1)}`;
    svg.appendChild(label);
  }

  async function refreshStatus() {
    const response = await fetch(`/api/v1/deployments/${id}/`,
      { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) return;
    const body = await response.json();
    const badge = document.getElementById("status");
    badge.textContent = body.status;
    badge.className = `status status-${body.status}`;
    document.getElementById("endpoint-http").textContent = body.endpoints.http || "—";
  }

  async function refresh() {
    refreshStatus().catch(() => {});
    try {
      const response = await fetch(`/api/v1/deployments/${id}/metrics?window=${windowSeconds}`,
        { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const body = await response.json();
      const model = body.models[0];
      const points = body.series.length ? body.series[0].points : [];
      const measured = points.filter(p => p.samples > 0);
      const latest = measured.length ? measured[measured.length - 1] : null;
      const summary = document.getElementById("summary");
      if (model) {
        summary.innerHTML = "";
        const parts = [
          ["Now", latest ? latest.throughput_inferences_per_second.toFixed(2) + " inf/s" : "—"],
          [`Window average`, model.throughput_inferences_per_second.toFixed(2) + " inf/s"],
          ["Requests", model.requests_per_second.toFixed(2) + " req/s"],
          ["Latency", model.average_request_latency_us.toFixed(0) + " µs"],
          ["Queue", model.average_queue_time_us.toFixed(0) + " µs"],
          ["Compute", model.average_compute_time_us.toFixed(0) + " µs"],
          ["Batch size", model.average_batch_size.toFixed(2)],
          ["Failures", String(model.failures)],
        ];
        for (const [name, value] of parts) {
          const span = document.createElement("span");
          span.textContent = `${name}: ${value}`;
          summary.appendChild(span);
        }
      } else {
        summary.textContent = "No metric samples yet.";
      }
      draw(document.getElementById("chart-throughput"), points, "throughput_inferences_per_second");
      draw(document.getElementById("chart-latency"), points, "average_request_latency_us");
    } catch (err) {
      document.getElementById("summary").textContent = `Could not load metrics: ${err.message}`;
    }
  }
  refresh();
  setInterval(refresh, 5000);
})();
