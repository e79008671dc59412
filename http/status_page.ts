/**
 * The live status page (`GET /status`): one self-contained HTML document that polls `/status/data`
 * every second and draws a server's GPU lease timeline (SVG), workers, recent requests and caches,
 * or a Router's nodes and recent requests.
 *
 * @module
 */

const _PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>KCoral status</title>
<link rel="icon" href="data:,">
<style>
  :root { color-scheme: light; --fg: #1d2430; --muted: #6b7585; --line: #dde2ea; --bar: #3b82c4;
    --init: #b9c3d1; --open: #e0892b; --bad: #c4372f; --ok: #2f8f4e; }
  body { font: 14px/1.4 system-ui, sans-serif; color: var(--fg); margin: 20px 28px; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  h2 { font-size: 15px; margin: 22px 0 8px; }
  .muted { color: var(--muted); }
  table { border-collapse: collapse; min-width: 60%; }
  th, td { text-align: left; padding: 3px 12px 3px 0; border-bottom: 1px solid var(--line);
    font-variant-numeric: tabular-nums; white-space: nowrap; }
  th { color: var(--muted); font-weight: 500; }
  .state-idle, .state-ready, .code-200 { color: var(--ok); }
  .state-busy { color: var(--open); }
  .state-broken, .state-unhealthy, .state-incompatible, .bad { color: var(--bad); }
  .gpu { margin: 6px 0 14px; }
  .gpu-title { margin-bottom: 2px; }
  svg { display: block; width: 100%; max-width: 1100px; height: 46px; background: #f6f8fb;
    border: 1px solid var(--line); }
  .hold { fill: var(--bar); }
  .hold.init { fill: var(--init); }
  .hold.open { fill: var(--open); }
  .hold-label { fill: white; font-size: 10px; pointer-events: none; }
  .axis { fill: var(--muted); font-size: 10px; }
  #error { color: var(--bad); }
</style>
</head>
<body>
<h1 id="title">KCoral</h1>
<div class="muted" id="subtitle">loading…</div>
<div id="error"></div>
<label class="muted">lease timeline: last <select id="window">
  <option value="10000">10 s</option><option value="60000" selected>1 min</option>
  <option value="300000">5 min</option></select></label>
<div id="content"></div>
<script>
"use strict";
let WINDOW_MS = 60 * 1000;
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const ms = (v) => (v === null || v === undefined) ? "–" : (v < 10 ? v.toFixed(2) : v.toFixed(0)) + " ms";
const bytes = (n) => { if (!n) return "0 B"; const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return (i ? n.toFixed(1) : n) + " " + u[i]; };
const short = (id) => String(id).startsWith("init:") ? id : String(id).startsWith("teardown:") ? "teardown:" + String(id).slice(9, 17) : String(id).slice(0, 8);
function table(headers, rows) {
  return "<table><tr>" + headers.map((h) => "<th>" + esc(h) + "</th>").join("") + "</tr>" +
    rows.map((r) => "<tr>" + r.map((c) => "<td" + (c && c.cls ? ' class="' + esc(c.cls) + '"' : "") + ">" + esc(c && c.text !== undefined ? c.text : c) + "</td>").join("") + "</tr>").join("") + "</table>";
}
function timeline(gpu, now) {
  const start = now - WINDOW_MS;
  const x = (t) => Math.max(0, Math.min(1000, ((t - start) / WINDOW_MS) * 1000));
  const holds = gpu.holds.filter((h) => h.to >= start).map((h) => ({ ...h, open: false }));
  for (const h of gpu.holders || (gpu.holder ? [gpu.holder] : [])) holds.push({ ...h, from: h.since, to: now, open: true });
  let svg = '<svg viewBox="0 0 1000 46" preserveAspectRatio="none" data-gpu="' + gpu.id + '">';
  const step = WINDOW_MS <= 10000 ? 1 : WINDOW_MS <= 60000 ? 10 : 30;
  for (let s = 0; s <= WINDOW_MS / 1000; s += step) {
    const px = x(start + s * 1000);
    svg += '<line x1="' + px + '" x2="' + px + '" y1="0" y2="46" stroke="#e3e7ee" stroke-width="1"/>';
    svg += '<text class="axis" x="' + (px + 2) + '" y="44">' + (s === WINDOW_MS / 1000 ? "now" : "-" + (WINDOW_MS / 1000 - s) + "s") + "</text>";
  }
  for (const h of holds) {
    const x0 = x(h.from), x1 = Math.max(x(h.to), x0 + 1.5);
    // Requests fill the lane; a worker's context creation (top half) may overlap a retiring
    // worker's teardown (bottom half), never a request.
    const worker = h.initialization || h.teardown;
    const cls = "hold" + (worker ? " init" : "") + (h.open ? " open" : "");
    const y = h.teardown ? 17 : 4, height = worker ? 13 : 26;
    svg += '<rect class="' + cls + '" data-request="' + esc(h.id) + '" x="' + x0.toFixed(2) + '" y="' + y + '" width="' + (x1 - x0).toFixed(2) + '" height="' + height + '"><title>' +
      esc(h.id) + " — " + ms(h.to - h.from) + (h.initialization ? " (worker initialization)" : h.teardown ? " (worker teardown)" : "") + "</title></rect>";
    if (x1 - x0 > 60) svg += '<text class="hold-label" x="' + (x0 + 3).toFixed(2) + '" y="' + (worker ? y + 10 : 21) + '">' + esc(short(h.id)) + "</text>";
  }
  return svg + "</svg>";
}
function renderServer(d) {
  document.getElementById("title").textContent = "KCoral server";
  const target = Object.entries(d.target).map(([k, v]) => k + "=" + v).join(", ") || "CPU";
  document.getElementById("subtitle").textContent = "kcoral " + d.version + " · instance " + d.instance_id + " · started " + d.started_at + " · target " + target + " · times UTC";
  let html = "<h2>Load</h2>" + table(["capacity", "in progress", "waiting for a worker", "waiting for a GPU lease"],
    [[d.load.request_capacity, d.load.requests_in_progress, d.load.requests_waiting, d.lease_waiting]]);
  if (d.gpus.length) {
    html += '<h2>GPU leases <span class="muted">(one bar per hold, labelled with its request; grey: worker context creation, top, or teardown, bottom; orange: held now)</span></h2>';
    for (const g of d.gpus) {
      const holders = g.holders || (g.holder ? [g.holder] : []);
      const holder = holders.length ? holders.map((h) => (h.initialization ? "initializing " : h.teardown ? "tearing down " : "held by ") + h.id + " for " + ms(d.now - h.since)).join("; ") : "free";
      html += '<div class="gpu"><div class="gpu-title">GPU ' + g.id + ' — <span class="holder">' + esc(holder) + "</span></div>" + timeline(g, d.now) + "</div>";
    }
  }
  html += "<h2>Workers</h2>" + table(["worker", "GPUs", "state", "generation"],
    d.workers.map((w) => [w.id, w.gpus.join(",") || "cpu", { text: w.state, cls: "state-" + w.state }, w.generation]));
  html += "<h2>Recent requests</h2>" + table(["finished", "request", "HTTP", "outcome", "GPU", "queue", "lease wait", "lease held", "elapsed"],
    d.requests.map((r) => [r.time.slice(11, 23), r.request_id, { text: r.http_status, cls: "code-" + r.http_status },
      { text: r.error_kind ? r.finish_reason + " (" + r.error_kind + ")" : r.finish_reason, cls: r.error_kind ? "bad" : "" },
      r.gpu_id === null ? "–" : r.gpu_id, ms(r.queue_ms), ms(r.lease_wait_ms), ms(r.lease_held_ms), ms(r.elapsed_ms)]));
  if (d.caches) {
    html += "<h2>Caches</h2>" + table(["cache", "held", "capacity", "hits", "misses", "evictions"],
      Object.entries(d.caches).map(([name, c]) => [name, bytes(c.bytes), c.capacity ? bytes(c.capacity) : "disabled", c.hits, c.misses, c.evictions]));
  }
  return html;
}
function renderRouter(d) {
  document.getElementById("title").textContent = "KCoral Router";
  document.getElementById("window").parentElement.hidden = true;
  document.getElementById("subtitle").textContent = "kcoral " + d.version + " · instance " + d.instance_id + " · started " + d.started_at + " · times UTC";
  let html = "<h2>Load</h2>" + table(["requests on nodes", "waiting for a slot"], [[d.active_requests, d.queue_length]]);
  html += '<h2>Nodes</h2><div id="nodes">' + table(["node", "state", "capacity", "busy", "available", "slots", "last report", "restarts", "last error"],
    d.nodes.map((n) => [n.name, { text: n.status, cls: "state-" + n.status }, n.capacity, n.in_flight, n.available_capacity, n.connected_data_slots,
      n.last_success_age_seconds === null ? "never" : n.last_success_age_seconds.toFixed(1) + " s ago", n.restarts, n.last_error || ""])) + "</div>";
  html += "<h2>Recent requests</h2>" + table(["finished", "request", "node", "HTTP", "outcome", "queue", "duration"],
    d.requests.map((r) => [r.time.slice(11, 23), r.request_id, r.node || "–", { text: r.http_status, cls: "code-" + r.http_status },
      { text: r.error_kind ? r.finish_reason + " (" + r.error_kind + ")" : r.finish_reason, cls: r.error_kind ? "bad" : "" }, ms(r.queue_wait_ms), ms(r.duration_ms)]));
  return html;
}
async function refresh() {
  try {
    const response = await fetch("status/data", { cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const data = await response.json();
    document.getElementById("content").innerHTML = data.kind === "router" ? renderRouter(data) : renderServer(data);
    document.getElementById("error").textContent = "";
    document.body.dataset.updated = String(Date.now());
  } catch (error) {
    document.getElementById("error").textContent = "cannot read status: " + error.message;
  }
}
document.getElementById("window").addEventListener("change", (event) => {
  WINDOW_MS = Number(event.target.value);
  refresh();
});
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
`;

/**
 * The status page (the same document for a server and a Router; its script asks `/status/data`
 * which one it is).
 */
export function statusPageResponse(): Response {
  return new Response(_PAGE, {
    headers: {
      "content-type": "text/html; charset=utf-8",
      // Nothing from elsewhere: the page's own script and style, and fetches to this origin.
      "content-security-policy":
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " +
        "connect-src 'self'; img-src 'self' data:",
      "cache-control": "no-store",
    },
  });
}
