// edgefleet dashboard: keeps [data-live] sections and the events table current from the
// hub's server-sent events. Everything the hub sends as HTML was escaped by the hub; events
// arrive as JSON and are shown with textContent only.
"use strict";
(function () {
  const MAX_ROWS = 500;

  function bars(root) {
    root.querySelectorAll(".bar .fill[data-pct]").forEach(function (el) {
      el.style.width = Math.max(0, Math.min(100, Number(el.dataset.pct) || 0)) + "%";
    });
  }

  function state(text) {
    document.body.dataset.stream = text;
    const el = document.getElementById("stream-state");
    if (el) el.textContent = text;
  }

  function liveSection(section) {
    const source = new EventSource(section.dataset.live);
    source.addEventListener("open", function () { state("connected"); });
    source.addEventListener("error", function () { state("reconnecting"); });
    source.addEventListener("html", function (e) {
      section.innerHTML = e.data;
      bars(section);
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    });
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
  }

  function liveEvents(box) {
    const tbody = box.querySelector("tbody");
    const url = box.dataset.stream + "?after=" + encodeURIComponent(box.dataset.position || "");
    const source = new EventSource(url);
    source.addEventListener("open", function () { state("connected"); });
    source.addEventListener("error", function () { state("reconnecting"); });
    source.addEventListener("event", function (e) {
      let ev;
      try { ev = JSON.parse(e.data); } catch (err) { return; }
      const row = document.createElement("tr");
      if (ev.type === "Warning") row.className = "bad";
      cell(row, new Date(ev.time * 1000).toISOString());
      cell(row, ev.type);
      cell(row, ev.kind + "/" + ev.name);
      cell(row, ev.reason);
      cell(row, ev.message);
      tbody.insertBefore(row, tbody.firstChild);
      while (tbody.rows.length > MAX_ROWS) tbody.deleteRow(tbody.rows.length - 1);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    bars(document);
    document.querySelectorAll("[data-live]").forEach(liveSection);
    document.querySelectorAll("[data-stream]").forEach(liveEvents);
  });
})();
