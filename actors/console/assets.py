"""The console's stylesheet, script and icon: served by the console itself (no CDN, no
build step). The pages work without the script; it only adds the body's text/hex
switch, live refresh of the parts that watch something, and confirmations."""

from __future__ import annotations

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dee8; --accent: #2457c5;
        --ok: #1d7a3a; --bad: #b3261e; --bg: #f6f7fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header { background: #16223a; color: #fff; padding: 0 1.2rem; display: flex; align-items: center; gap: 1.5rem; }
header .brand { font-weight: 700; padding: .7rem 0; }
header nav a { color: #c9d4ea; text-decoration: none; padding: .7rem .6rem; display: inline-block; }
header nav a.active, header nav a:hover { color: #fff; background: #24355a; }
header .ns { margin-left: auto; color: #c9d4ea; font-size: 12px; }
main { padding: 1rem 1.2rem 3rem; max-width: 1400px; }
h1 { font-size: 20px; margin: .4rem 0 1rem; }
h2 { font-size: 16px; margin: 1.6rem 0 .6rem; }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); margin-bottom: .8rem; }
th, td { padding: .35rem .6rem; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #eef1f6; font-weight: 600; font-size: 12px; text-transform: uppercase; color: var(--muted); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
pre { background: #fff; border: 1px solid var(--line); padding: .6rem; overflow: auto; max-height: 32rem; }
.flash { padding: .6rem .8rem; border-radius: 4px; margin-bottom: 1rem; border: 1px solid; }
.flash.ok { color: var(--ok); background: #e9f6ee; border-color: #b5dfc3; }
.flash.error { color: var(--bad); background: #fcebea; border-color: #efbdb9; }
form.inline { display: inline; }
form.panel { background: #fff; border: 1px solid var(--line); padding: .8rem; display: flex; flex-wrap: wrap; gap: .6rem; align-items: end; margin-bottom: 1rem; }
form.panel label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: .2rem; }
form.panel textarea { width: 28rem; height: 4.5rem; }
input, select, textarea, button { font: inherit; padding: .3rem .45rem; border: 1px solid #b9c1d0; border-radius: 3px; }
button { background: var(--accent); color: #fff; border-color: var(--accent); cursor: pointer; }
button.secondary { background: #fff; color: var(--accent); }
.muted { color: var(--muted); }
.bad { color: var(--bad); font-weight: 600; }
.good { color: var(--ok); font-weight: 600; }
.tabs button { margin-right: .3rem; }
.tabs button[aria-pressed="true"] { background: #16223a; border-color: #16223a; color: #fff; }
.hidden { display: none; }
.total { font-size: 18px; font-weight: 700; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
figure.chart { margin: 0 0 1rem; background: #fff; border: 1px solid var(--line); padding: .6rem; }
figure.chart figcaption { font-size: 12px; font-weight: 600; margin-bottom: .3rem; }
figure.chart svg { display: block; max-width: 100%; height: auto; }
ul.legend { list-style: none; margin: .3rem 0 0; padding: 0; display: flex; flex-wrap: wrap; gap: .8rem; font-size: 12px; }
progress { width: 24rem; height: 1.1rem; vertical-align: middle; }
"""

JS = """
"use strict";
(function () {
  // the body of a message: text or hex
  document.querySelectorAll("[data-tab]").forEach(function (button) {
    button.addEventListener("click", function () {
      var group = button.closest(".tabs");
      group.querySelectorAll("[data-tab]").forEach(function (b) {
        var on = b === button;
        b.setAttribute("aria-pressed", on ? "true" : "false");
        document.getElementById(b.dataset.tab).classList.toggle("hidden", !on);
      });
    });
  });

  // forms that change a lot ask first
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) { event.preventDefault(); }
    });
  });

  // parts of a page that watch something refresh themselves from the same page
  document.querySelectorAll("[data-refresh-ms]").forEach(function (part) {
    var every = parseInt(part.dataset.refreshMs, 10);
    var status = document.getElementById(part.id + "-refreshed");
    function refresh() {
      if (document.hidden) { return; }
      fetch(window.location.href, {credentials: "same-origin", headers: {"X-Console-Refresh": "1"}})
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.text();
        })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById(part.id);
          if (fresh) { part.innerHTML = fresh.innerHTML; }
          if (status) { status.textContent = "refreshed " + new Date().toLocaleTimeString(); }
        })
        .catch(function (err) {
          if (status) { status.textContent = "refresh failed: " + err.message; }
        });
    }
    window.setInterval(refresh, every);
  });

  // a long operation: poll its progress until it ends
  var job = document.getElementById("job");
  if (job) {
    var poll = function () {
      fetch(job.dataset.job, {credentials: "same-origin"})
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.json();
        })
        .then(function (j) {
          var bar = document.getElementById("job-progress");
          bar.max = Math.max(j.total, 1);
          bar.value = j.state === "done" ? bar.max : j.done;
          document.getElementById("job-percent").textContent = j.percent + "%";
          document.getElementById("job-count").textContent = j.done + " of " + j.total;
          var state = document.getElementById("job-state");
          state.textContent = j.state;
          state.className = j.state === "done" ? "good" : (j.state === "failed" ? "bad" : "");
          document.getElementById("job-message").textContent = j.message;
          if (j.state === "running") { window.setTimeout(poll, 250); }
        })
        .catch(function (err) {
          document.getElementById("job-message").textContent = "progress unknown: " + err.message;
          window.setTimeout(poll, 1000);
        });
    };
    if (document.getElementById("job-state").textContent === "running") { poll(); }
  }
})();
"""

FAVICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#2457c5"/>'
    '<path d="M4 12V4h4.5a2.5 2.5 0 0 1 0 5H6l4 3" stroke="#fff" stroke-width="1.6" fill="none"/>'
    "</svg>"
)
