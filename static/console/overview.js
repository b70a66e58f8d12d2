// Throughput sparklines of the overview's deployments (uPlot), from each one's metrics over the last 15 minutes,
// refreshed every 15 s.
(function () {
  "use strict";
  const charts = window.conchCharts;
  const cells = Array.from(document.querySelectorAll("[data-sparkline]"));
  const views = new Map(cells.map((el) => [el, charts.timeSeries(el, [{ label: "inf/s" }], {
    width: 160, height: 36, axes: false, legend: false, cursor: false,
  })]));

  function rateText(rate) {
    if (rate === 0) return "0 inf/s";
    return rate < 0.01 ? `${rate.toPrecision(1)} inf/s` : `${rate.toFixed(2)} inf/s`;
  }

  async function refresh() {
    for (const [el, view] of views) {
      const id = el.dataset.sparkline;
      try {
        const response = await fetch(`/api/v1/deployments/${id}/metrics?window=900`,
          { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) continue;
        const body = await response.json();
        const points = body.series.length ? body.series[0].points : [];
        view.update(points.map((p) => Date.parse(p.time) / 1000),
          [points.map((p) => (p.samples ? p.throughput_inferences_per_second : null))]);
        // The API's rate: over the whole stated window (15 min, or since the deployment was created), not over the
        // stretch its samples happen to cover: one inference ten minutes ago is 0.001 inf/s, not 0.27 inf/s over
        // the 3.7 s between two samples (deployments.observe.rate_span_seconds).
        const model = body.models[0];
        const rate = model ? model.throughput_inferences_per_second : null;
        document.getElementById(`spark-value-${id}`).textContent = rate === null ? "no data" : rateText(rate);
      } catch (err) {
        // A deployment whose metrics cannot be read keeps its empty sparkline.
      }
    }
  }
  refresh();
  setInterval(refresh, 15000);
})();
