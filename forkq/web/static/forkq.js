// forkq dashboard: live refresh of <main>, confirmations, select-all boxes and the
// throughput chart. No library, no inline script (the CSP forbids it).
(function () {
  "use strict";
  var PAUSE_KEY = "forkq-refresh-paused";
  var SAMPLES_KEY = "forkq-throughput";
  var MAX_SAMPLES = 90;
  var busy = false;

  function paused() { return window.localStorage.getItem(PAUSE_KEY) === "1"; }

  function showToggle() {
    var button = document.getElementById("refresh-toggle");
    if (!button) { return; }
    var off = paused();
    button.textContent = off ? "paused" : "live";
    button.setAttribute("aria-pressed", off ? "true" : "false");
  }

  // A refresh would lose what the visitor is doing: typing, a selection, a focused control.
  function interacting(main) {
    if (main.querySelector("[data-norefresh]")) { return true; }
    if (main.querySelector("input[type=checkbox]:checked")) { return true; }
    var active = document.activeElement;
    if (active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    var selection = window.getSelection && window.getSelection();
    return Boolean(selection && String(selection) !== "" && main.contains(selection.anchorNode));
  }

  function refresh() {
    var main = document.querySelector("main");
    if (!main || busy || paused() || document.hidden || interacting(main)) { return; }
    busy = true;
    window.fetch(window.location.href, {credentials: "same-origin",
                                        headers: {"X-Forkq-Refresh": "1"}})
      .then(function (response) {
        if (!response.ok || response.redirected) { throw new Error("status " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.querySelector("main");
        var current = document.querySelector("main");
        if (!fresh || !current || fresh.id !== current.id || interacting(current)) { return; }
        current.innerHTML = fresh.innerHTML;
        var stamp = page.getElementById("refreshed");
        var mine = document.getElementById("refreshed");
        if (stamp && mine) { mine.textContent = stamp.textContent; }
        document.body.classList.remove("stale");
        afterUpdate();
      })
      .catch(function () { document.body.classList.add("stale"); })
      .then(function () { busy = false; });
  }

  // --- throughput chart (dashboard) ------------------------------------------------------

  function loadSamples() {
    try { return JSON.parse(window.sessionStorage.getItem(SAMPLES_KEY) || "[]"); }
    catch (e) { return []; }
  }

  function sample() {
    var source = document.getElementById("throughput");
    if (!source) { return null; }
    var samples = loadSamples();
    var point = {t: Number(source.getAttribute("data-at")) || Date.now() / 1000,
                 p: Number(source.getAttribute("data-processed")) || 0,
                 f: Number(source.getAttribute("data-failed")) || 0};
    var last = samples[samples.length - 1];
    if (!last || point.t > last.t) { samples.push(point); }
    if (last && point.p < last.p) { samples = [point]; }  // counters reset: start over
    samples = samples.slice(-MAX_SAMPLES);
    window.sessionStorage.setItem(SAMPLES_KEY, JSON.stringify(samples));
    return samples;
  }

  function rates(samples) {
    var out = [];
    for (var i = 1; i < samples.length; i++) {
      var dt = samples[i].t - samples[i - 1].t;
      if (dt <= 0 || dt > 600) { continue; }
      out.push({t: samples[i].t, p: (samples[i].p - samples[i - 1].p) / dt,
                f: (samples[i].f - samples[i - 1].f) / dt});
    }
    return out;
  }

  var SVG = "http://www.w3.org/2000/svg";

  function element(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    parent.appendChild(node);
    return node;
  }

  function drawChart() {
    var svg = document.getElementById("throughput-chart");
    var samples = sample();
    if (!svg || !samples) { return; }
    var points = rates(samples);
    var width = Math.max(300, Math.round(svg.clientWidth || 600));
    var height = Math.max(120, Math.round(svg.clientHeight || 180)), left = 40, bottom = 20;
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("data-points", String(points.length));
    var top = 1;  // the scale: the largest rate plus headroom
    points.forEach(function (p) { top = Math.max(top, p.p, p.f); });
    top = top * 1.15;
    for (var g = 0; g <= 4; g++) {
      var y = (height - bottom) * g / 4 + 2;
      element("line", {x1: left, x2: width, y1: y, y2: y, "class": "grid"}, svg);
      element("text", {x: 2, y: y + 4}, svg).textContent = (top * (4 - g) / 4).toFixed(top < 4 ? 1 : 0);
    }
    if (points.length === 0) {
      element("text", {x: left + 10, y: height / 2}, svg).textContent =
        "collecting: the chart draws the rate between refreshes";
      return;
    }
    var t0 = points[0].t, span = (points[points.length - 1].t - t0) || 1;
    ["p", "f"].forEach(function (key) {
      var path = points.map(function (p) {
        var x = left + (width - left - 4) * (points.length === 1 ? 1 : (p.t - t0) / span);
        var y = 2 + (height - bottom) * (1 - p[key] / top);
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" ");
      element("polyline", {points: path, "class": key === "p" ? "processed" : "failed"}, svg);
    });
    var latest = points[points.length - 1];
    var label = document.getElementById("throughput-now");
    if (label) {
      label.textContent = latest.p.toFixed(1) + " processed/s, " + latest.f.toFixed(1) + " failed/s";
    }
  }

  // --- forms ----------------------------------------------------------------------------

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { event.preventDefault(); }
  });

  document.addEventListener("change", function (event) {
    var box = event.target;
    var name = box && box.getAttribute && box.getAttribute("data-select-all");
    if (!name || !box.form) { return; }
    box.form.querySelectorAll("input[type=checkbox][name='" + name + "']").forEach(function (b) {
      b.checked = box.checked;
    });
  });

  function afterUpdate() { drawChart(); }

  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("refresh-toggle");
    if (toggle) {
      toggle.addEventListener("click", function () {
        window.localStorage.setItem(PAUSE_KEY, paused() ? "0" : "1");
        showToggle();
      });
    }
    showToggle();
    afterUpdate();
    var every = Number(document.body.getAttribute("data-refresh-ms")) || 5000;
    window.setInterval(refresh, Math.max(1000, every));
  });
}());
