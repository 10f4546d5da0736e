// The analytics dashboard in the browser: filters that apply themselves, and the charts drawn with
// Chart.js from the figures the page carries (#analytics-charts). Every bar leads to the calls
// behind it. Without JavaScript the same figures are in the tables beside each chart.
(function () {
  "use strict";

  // Okabe–Ito: told apart with every common colour-vision deficiency. Each series also gets a
  // pattern of its own, so that colour is never the only difference.
  var PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
  var SHAPES = ["solid", "diagonal", "dots", "horizontal", "cross", "vertical", "back", "grid"];
  var STATUS = {
    executed: ["#009E73", "solid"],
    rejected: ["#D55E00", "diagonal"],
    expired: ["#8a8a8a", "dots"],
    invalidated: ["#E69F00", "horizontal"],
    failed: ["#CC79A7", "cross"],
    unknown: ["#F0E442", "back"],
    pending: ["#56B4E9", "vertical"],
    approved: ["#0072B2", "grid"],
    executing: ["#0072B2", "grid"],
  };

  function light(hex) {
    var n = parseInt(hex.slice(1), 16);
    var r = n >> 16, g = (n >> 8) & 255, b = n & 255;
    return 0.299 * r + 0.587 * g + 0.114 * b > 160;
  }

  function pattern(colour, shape) {
    if (shape === "solid") return colour;
    var size = 8;
    var tile = document.createElement("canvas");
    tile.width = tile.height = size;
    var c = tile.getContext("2d");
    c.fillStyle = colour;
    c.fillRect(0, 0, size, size);
    c.strokeStyle = c.fillStyle = light(colour) ? "rgba(0,0,0,0.45)" : "rgba(255,255,255,0.65)";
    c.lineWidth = 1.5;
    c.beginPath();
    if (shape === "diagonal" || shape === "cross") { c.moveTo(0, size); c.lineTo(size, 0); }
    if (shape === "back" || shape === "cross") { c.moveTo(0, 0); c.lineTo(size, size); }
    if (shape === "horizontal" || shape === "grid") { c.moveTo(0, size / 2); c.lineTo(size, size / 2); }
    if (shape === "vertical" || shape === "grid") { c.moveTo(size / 2, 0); c.lineTo(size / 2, size); }
    c.stroke();
    if (shape === "dots") { c.beginPath(); c.arc(size / 2, size / 2, 1.6, 0, 2 * Math.PI); c.fill(); }
    return c.createPattern(tile, "repeat");
  }

  function style(index) {
    var colour = PALETTE[index % PALETTE.length];
    return { backgroundColor: pattern(colour, SHAPES[index % SHAPES.length]), borderColor: colour };
  }

  function percent(value) { return value + " %"; }

  // Per chart: how it is laid out, beyond its figures.
  var LAYOUTS = {
    // Periods may skip labels when crowded; tools, statuses and reviewers never do.
    rejection_over_time: { stacked: true, yTicks: percent, skipLabels: true },
    recovery_by_tool: { max: 100, yTicks: percent, legend: false, zeroShows: true },
    stuck_by_tool: { integers: true },
    confirmation_outcomes: { horizontal: true, integers: true, legend: false, byStatus: true },
    decision_times: { horizontal: true },
  };

  function draw(canvas, chart, layout) {
    var datasets = chart.series.map(function (series, index) {
      var look = style(series.look === null || series.look === undefined ? index : series.look);
      var dataset = {
        label: series.label,
        data: series.values,
        backgroundColor: look.backgroundColor,
        borderColor: look.borderColor,
        borderWidth: 1,
        maxBarThickness: 48,
        // A rate of 0 % is a finding, not a missing bar.
        minBarLength: layout.zeroShows ? 3 : 0,
      };
      if (layout.byStatus) {
        dataset.backgroundColor = chart.labels.map(function (status) {
          var s = STATUS[status] || [PALETTE[0], "solid"];
          return pattern(s[0], s[1]);
        });
        dataset.borderColor = chart.labels.map(function (status) { return (STATUS[status] || [PALETTE[0]])[0]; });
      }
      return dataset;
    });
    var valueAxis = {
      beginAtZero: true,
      stacked: !!layout.stacked,
      max: layout.max,
      ticks: { precision: layout.integers ? 0 : undefined, callback: layout.yTicks },
    };
    var categoryAxis = {
      stacked: !!layout.stacked,
      grid: { display: false },
      ticks: { autoSkip: !!layout.skipLabels, maxRotation: layout.skipLabels ? 0 : 45 },
    };
    return new window.Chart(canvas, {
      type: "bar",
      data: { labels: chart.labels, datasets: datasets },
      options: {
        indexAxis: layout.horizontal ? "y" : "x",
        maintainAspectRatio: false,
        animation: false,
        scales: layout.horizontal ? { x: valueAxis, y: categoryAxis } : { x: categoryAxis, y: valueAxis },
        plugins: {
          legend: { display: layout.legend !== false, position: "bottom", labels: { boxWidth: 14 } },
          tooltip: {
            callbacks: {
              label: function (item) {
                return item.dataset.label + ": " + chart.series[item.datasetIndex].texts[item.dataIndex];
              },
              footer: function () { return "Click for the calls"; },
            },
          },
        },
        onClick: function (event, elements) {
          if (!elements.length) return;
          var url = chart.series[elements[0].datasetIndex].urls[elements[0].index];
          if (url) window.location.assign(url);
        },
        onHover: function (event, elements) {
          event.native.target.style.cursor = elements.length ? "pointer" : "default";
        },
      },
    });
  }

  function drawAll() {
    var source = document.getElementById("analytics-charts");
    if (!source || !window.Chart) return;
    var charts = JSON.parse(source.textContent);
    window.Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
    window.Chart.defaults.color = "#3b4250";
    window.analyticsCharts = {};
    document.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      var name = canvas.dataset.chart;
      if (!charts[name] || !charts[name].series.length) return;
      var box = canvas.parentElement;
      box.hidden = false;
      window.analyticsCharts[name] = draw(canvas, charts[name], LAYOUTS[name] || {});
      // The chart shows the figures now; their table stays one click away.
      var table = box.nextElementSibling;
      if (table && table.tagName === "DETAILS") table.open = false;
      canvas.dataset.drawn = "true";
    });
  }

  function filtersApplyThemselves() {
    var form = document.querySelector("form[data-autosubmit]");
    if (!form) return;
    form.addEventListener("change", function (event) {
      var field = event.target;
      if (field.type === "date") {
        // A date picked means a custom range; it applies with the button, once both are set.
        var custom = form.querySelector('input[name="range"][value="custom"]');
        if (custom) custom.checked = true;
        return;
      }
      if (field.name === "range" && field.value === "custom") return;
      form.requestSubmit();
    });
    // Only what is chosen goes into the URL: no empty filters, no dates for a named range.
    form.addEventListener("submit", function () {
      var range = form.querySelector('input[name="range"]:checked');
      var custom = range && range.value === "custom";
      form.querySelectorAll("select, input[type=date]").forEach(function (field) {
        if (!field.value || (field.type === "date" && !custom)) field.disabled = true;
      });
      if (custom && range) range.disabled = true;
    });
    // Back to this page from the history: the fields must work again.
    window.addEventListener("pageshow", function () {
      form.querySelectorAll("[disabled]").forEach(function (field) { field.disabled = false; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    filtersApplyThemselves();
    drawAll();
  });
})();
