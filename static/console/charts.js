// Shared chart helpers of the console pages, over uPlot (npm `uplot`, served from static/vendor/uplot/).
// window.conchCharts.timeSeries(el, series, opts) draws a time chart into `el` and returns an object whose
// update(times, columns) redraws it and records the number of non-null points in el.dataset.points. A null value is
// a gap (no sample in that step: the deployment was down, restarting, or not scraped): the line breaks there rather
// than joining the points on either side, which would draw traffic that was never measured. The uPlot instance is
// el.uplot (the browser tests read its scales and canvas).
(function () {
  "use strict";
  const palette = ["#1f6fb2", "#c2410c", "#15803d", "#7c3aed", "#b91c1c"];

  function countPoints(columns) {
    let n = 0;
    for (const column of columns) for (const v of column) if (v !== null && v !== undefined) n += 1;
    return n;
  }

  function timeSeries(el, series, opts) {
    const options = opts || {};
    const width = options.width || Math.max(280, el.clientWidth || 520);
    const height = options.height || 180;
    const spec = {
      width,
      height,
      legend: { show: options.legend !== false },
      cursor: { show: options.cursor !== false },
      // From zero up; an empty or all-zero chart gets 0..1 (not a stack of zero ticks).
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
      axes: options.axes === false ? [{ show: false }, { show: false }] : [{}, { size: 60 }],
      series: [{}].concat(series.map((s, i) => ({
        label: s.label,
        stroke: s.color || palette[i % palette.length],
        width: 2,
        spanGaps: false,
        points: { show: true, size: 5 },
        value: (u, v) => (v === null || v === undefined ? "—" : v.toFixed(s.digits === undefined ? 2 : s.digits)),
      }))),
    };
    const empty = [[]].concat(series.map(() => []));
    const plot = new uPlot(spec, empty, el);
    el.uplot = plot;
    return {
      plot,
      update(times, columns) {
        plot.setData([times].concat(columns));
        el.dataset.points = String(countPoints(columns));
      },
    };
  }

  window.conchCharts = { timeSeries, countPoints };
})();
