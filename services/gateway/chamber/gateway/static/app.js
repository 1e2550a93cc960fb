// Chamber's dashboard: a client of the public API (same token, same endpoints, the live stream). No framework,
// no CDN: this file, app.css and index.html ship in the wheel.
"use strict";

const TOKEN_KEY = "chamber-token";
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem(TOKEN_KEY) || "";
let me = null;
let stream = null;
let refreshTimer = null;

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const pct = (x) => (x === null || x === undefined ? "–" : `${(x * 100).toFixed(0)}%`);
const num = (x, d = 0) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
const badge = (s) => `<span class="badge ${esc(s)}">${esc(s)}</span>`;
const clock = (ts) => (ts ? new Date(ts * 1000).toLocaleTimeString() : "–");
function age(ts) {
  if (!ts) return "–";
  const s = Math.max(0, Math.floor(Date.now() / 1000 - ts));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path) {
  const resp = await fetch(path, { headers: { authorization: `Bearer ${token}` } });
  if (resp.status === 401) {
    logout("Your token was refused (unknown or revoked). Sign in again.");
    throw new ApiError(401, "unauthorized");
  }
  const body = await resp.json();
  if (!resp.ok) throw new ApiError(resp.status, body.detail || resp.statusText);
  return body;
}

function table(el, headers, rows) {
  const numeric = headers.map((h) => h.endsWith("#"));
  const head = `<thead><tr>${headers.map((h, i) => `<th class="${numeric[i] ? "num" : ""}">${esc(h.replace(/#$/, ""))}</th>`).join("")}</tr></thead>`;
  const body = rows.length ? rows.map((r) => `<tr>${r.map((c, i) => `<td class="${numeric[i] ? "num" : ""}">${c}</td>`).join("")}</tr>`).join("")
    : `<tr><td colspan="${headers.length}" class="muted">nothing here</td></tr>`;
  el.innerHTML = head + `<tbody>${body}</tbody>`;
}

// ---- overview ------------------------------------------------------------------------------------------------

function renderTiles(fleet, heat) {
  const busy = heat ? heat.flatMap((n) => n.gpus).filter((g) => (g.util ?? 0) >= 5).length : null;
  const tiles = [
    ["GPUs total", fleet.gpus_total, "gpus-total"],
    ["healthy", fleet.gpus_healthy ?? "–", "gpus-healthy"],
    ["allocated", fleet.gpus_allocated, "gpus-allocated"],
    ["busy", busy ?? "–", "gpus-busy"],
    ["utilization", pct(fleet.utilization), "utilization"],
    ["idle ratio", pct(fleet.idle_ratio), "idle-ratio"],
    ["efficiency score", fleet.efficiency_score === null ? "–" : num(fleet.efficiency_score), "efficiency"],
    ["queue depth", fleet.queue_depth, "queue-depth"],
    ["idle cost / h", fleet.idle_cost_per_hour === null ? "–" : `$${num(fleet.idle_cost_per_hour)}`, "idle-cost"],
  ];
  $("tiles").innerHTML = tiles.map(([label, value, id]) =>
    `<div class="tile" data-tile="${id}"><div class="value">${esc(value)}</div><div class="label">${esc(label)}</div></div>`).join("");
}

function renderChart(alloc, util) {
  const w = 600, h = 220, pad = 28;
  const points = [...alloc.points, ...util.points];
  if (!points.length) { $("chart").innerHTML = `<p class="muted">no history yet</p>`; return; }
  const t0 = Math.min(...points.map((p) => p[0])), t1 = Math.max(...points.map((p) => p[0]), t0 + 60);
  const x = (t) => pad + ((t - t0) / (t1 - t0)) * (w - pad * 2);
  const y = (v) => h - pad - Math.max(0, Math.min(1, v)) * (h - pad * 2);
  const line = (pts, cls, color) => pts.length
    ? `<polyline class="${cls}" fill="none" stroke="${color}" stroke-width="2" points="${pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")}"/>` +
      pts.map((p) => `<circle class="${cls}" cx="${x(p[0]).toFixed(1)}" cy="${y(p[1]).toFixed(1)}" r="3" fill="${color}"/>`).join("")
    : "";
  const grid = [0, 0.5, 1].map((v) => `<line class="axis" x1="${pad}" x2="${w - pad}" y1="${y(v)}" y2="${y(v)}"/><text x="2" y="${y(v) + 3}">${v * 100}%</text>`).join("");
  const times = `<text x="${pad}" y="${h - 8}">${clock(t0)}</text><text x="${w - pad - 50}" y="${h - 8}">${clock(t1)}</text>`;
  $("chart").innerHTML = `<svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none">${grid}${times}${line(alloc.points, "alloc", "var(--alloc)")}${line(util.points, "util", "var(--util)")}</svg>`;
}

function heatColor(util) {
  if (util === null || util === undefined) return null;
  const u = Math.max(0, Math.min(100, util)) / 100;
  const hue = 210 - u * 90; // blue (idle) to green (busy)
  return `hsl(${hue}, ${40 + u * 40}%, ${92 - u * 50}%)`;
}

function renderHeatmap(nodes) {
  $("heatmap").innerHTML = nodes.map((n) => {
    const cells = n.gpus.map((g) => {
      const color = heatColor(g.util);
      const title = `${n.name} GPU ${g.index}: ${g.util === null ? "no reading" : `${num(g.util)}% busy`}` +
        (g.allocated_to ? `, job ${g.allocated_to}` : ", free") + (g.unschedulable ? `, out: ${g.unschedulable}` : "");
      const cls = ["cell", g.unschedulable ? "out" : "", color ? "" : "silent"].join(" ");
      return `<div class="${cls}" data-node="${esc(n.name)}" data-gpu="${g.index}" title="${esc(title)}" style="${color ? `background:${color}` : ""}"></div>`;
    }).join("");
    return `<div class="hrow"><a href="#/node/${encodeURIComponent(n.name)}">${esc(n.name)}</a><div class="hcells">${cells}</div></div>`;
  }).join("");
}

async function showOverview() {
  const [fleet, heat, alloc, util] = await Promise.all([
    api("/v1/fleet"), api("/v1/fleet/gpus"),
    api("/v1/fleet/history?metric=allocation_ratio&window=1h"), api("/v1/fleet/history?metric=utilization&window=1h"),
  ]);
  renderTiles(fleet, heat);
  renderHeatmap(heat);
  renderChart(alloc, util);
}

// ---- teams, queue, jobs --------------------------------------------------------------------------------------

function quotaBar(u) {
  const scale = Math.max(u.nominal, u.gpus_running, 1);
  return `<div class="bar" title="${u.gpus_running} running of ${u.nominal} guaranteed">` +
    `<span class="used" style="width:${(100 * u.gpus_running) / scale}%"></span>` +
    `<span class="nominal" style="width:${(100 * u.nominal) / scale}%"></span></div>`;
}

async function showTeams() {
  const teams = await api("/v1/teams");
  table($("teams-table"), ["team", "org", "quota vs usage", "nominal#", "running#", "borrowed#", "lent#", "fair share#", "pending#", "GPU-hours#", "budget"],
    teams.map((t) => {
      const u = t.usage;
      const budget = u.budget_state === "none" ? badge("none") : `${badge(u.budget_state)} ${pct(u.budget_used)}`;
      return [`<b>${esc(t.name)}</b>`, esc(t.config?.org ?? u.org), quotaBar(u), u.nominal, u.gpus_running, u.borrowed, u.lent,
        num(u.fair_share, 1), u.jobs_pending, num(u.gpu_hours, 1), budget];
    }));
}

const jobLink = (j) => `<a href="#/job/${encodeURIComponent(j.id)}">${esc(j.name)}</a>`;

async function showQueue() {
  const [pending, preempted] = await Promise.all([api("/v1/jobs?state=pending&limit=500"), api("/v1/jobs?state=preempted&limit=500")]);
  const queue = [...pending, ...preempted].sort((a, b) => a.submitted_at - b.submitted_at);
  $("queue-count").textContent = `${queue.length} waiting, oldest first`;
  table($("queue-table"), ["job", "team", "GPUs#", "priority", "state", "waiting", "why it waits"],
    queue.map((j) => [jobLink(j), esc(j.team), `${j.replicas}×${j.gpus_per_replica}`, esc(j.priority), badge(j.state), age(j.submitted_at), esc(j.reason)]));
}

async function showJobs() {
  const jobs = await api("/v1/jobs?limit=200");
  table($("jobs-table"), ["job", "id", "team", "state", "GPUs#", "priority", "age", "reason"],
    jobs.map((j) => [jobLink(j), `<code>${esc(j.id)}</code>`, esc(j.team), badge(j.state), `${j.replicas}×${j.gpus_per_replica}`, esc(j.priority), age(j.submitted_at), esc(j.reason)]));
}

async function showJob(id) {
  const data = await api(`/v1/jobs/${encodeURIComponent(id)}/events`);
  const j = data.job;
  $("job-title").innerHTML = `${esc(j.name)} ${badge(j.state)}`;
  const nodes = j.placement ? [...new Set(j.placement.gpus.map((g) => g[0]))].join(", ") : "–";
  const fields = [["id", `<code>${esc(j.id)}</code>`], ["team", esc(j.team)], ["priority", esc(j.priority)],
    ["GPUs", `${j.replicas} × ${j.gpus_per_replica}`], ["reason", esc(j.reason)], ["submitted", clock(j.submitted_at)],
    ["attempt", j.attempt], ["preemptions", j.preemptions], ["ran", `${num(j.run_s, 1)} s (lost ${num(j.lost_s, 1)} s)`], ["nodes", esc(nodes)]];
  $("job-fields").innerHTML = fields.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
  $("timeline").innerHTML = data.events.map((e) => {
    const by = e.by ? ` by <a href="#/job/${encodeURIComponent(e.by)}">${esc(e.by)}</a>` : "";
    const gpus = e.gpus ? ` (${e.gpus.length} GPUs)` : "";
    return `<li class="${esc(e.kind)}"><span class="when">${clock(e.at)}</span><span class="kind">${esc(e.kind)}</span>${by}${gpus} <span class="muted">${esc(e.detail)}</span></li>`;
  }).join("");
}

// ---- nodes ---------------------------------------------------------------------------------------------------

async function showNodes() {
  const nodes = await api("/v1/nodes");
  table($("nodes-table"), ["node", "pool", "model", "rack", "GPUs#", "allocated#", "out of service#", "why"],
    nodes.map((n) => [`<a href="#/node/${encodeURIComponent(n.name)}">${esc(n.name)}</a>`, esc(n.pool), esc(n.gpu_model), esc(n.rack),
      n.gpus_total, n.gpus_allocated, n.gpus_unschedulable,
      esc(Object.entries(n.unschedulable).map(([i, r]) => `GPU ${i}: ${r}`).join("; "))]));
}

async function showNode(name) {
  const v = await api(`/v1/nodes/${encodeURIComponent(name)}`);
  $("node-title").innerHTML = `${esc(name)} ${badge(v.state)}`;
  const fields = [["pool", esc(v.node.pool)], ["model", esc(v.node.gpu_model)], ["rack / zone", `${esc(v.node.rack)} / ${esc(v.node.zone)}`],
    ["allocated", `${v.node.gpus_allocated} of ${v.node.gpus_total}`], ["out of service", v.node.gpus_unschedulable],
    ["recommended action", v.action ? `<span class="action">${esc(v.action)}</span>` : "–"], ["reason", esc(v.reason || "–")]];
  $("node-fields").innerHTML = fields.map(([k, x]) => `<dt>${k}</dt><dd>${x}</dd>`).join("");
  table($("node-gpus"), ["GPU#", "state", "reason", "recommended action", "job"],
    v.gpus.map((g) => [g.index, badge(g.state), esc(g.reason), g.action ? `<span class="action">${esc(g.action)}</span>` : "–",
      g.allocated_to ? `<a href="#/job/${encodeURIComponent(g.allocated_to)}">${esc(g.allocated_to)}</a>` : "–"]));
  table($("node-history"), ["when", "GPU", "state", "rule", "severity", "reason", "action"],
    [...v.history].reverse().map((h) => [clock(h.observed_at), h.gpu_index ?? "node", badge(h.state), esc(h.rule), esc(h.severity), esc(h.reason),
      h.action ? `<span class="action">${esc(h.action)}</span>` : "–"]));
}

// ---- routing, live updates, login ----------------------------------------------------------------------------

const VIEWS = { overview: showOverview, teams: showTeams, queue: showQueue, jobs: showJobs, job: showJob, nodes: showNodes, node: showNode };

function route() {
  const [, name = "overview", arg] = (location.hash || "#/overview").split("/");
  return { name: VIEWS[name] ? name : "overview", arg: arg ? decodeURIComponent(arg) : undefined };
}

async function render() {
  if (!me) return;
  const { name, arg } = route();
  document.querySelectorAll(".view").forEach((v) => v.classList.toggle("shown", v.id === `view-${name}`));
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === name || (a.dataset.view + "s") === name || a.dataset.view === `${name}s`));
  try {
    await VIEWS[name](arg);
    document.body.dataset.rendered = name;
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) console.error(err);
  }
}

function scheduleRefresh() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(render, 400);
}

async function follow() {
  const controller = new AbortController();
  stream = controller;
  while (stream === controller) {
    try {
      const resp = await fetch("/v1/stream?topics=job,fleet,health", { headers: { authorization: `Bearer ${token}` }, signal: controller.signal });
      if (!resp.ok) throw new Error(`stream ${resp.status}`);
      $("live").className = "live on";
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "", event = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl).replace(/\r$/, "");
          buffer = buffer.slice(nl + 1);
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:") && line.slice(5).trim()) onEvent(event, line.slice(5));
        }
      }
    } catch (err) {
      if (controller.signal.aborted) return;
    }
    $("live").className = "live off";
    await new Promise((r) => setTimeout(r, 2000));
  }
}

function onEvent(event, data) {
  if (event === "fleet" && route().name === "overview") {
    const tiles = $("tiles");
    if (tiles.children.length) renderTiles(JSON.parse(data), null);
  }
  if (event === "job" || event === "health" || event === "resync" || event === "fleet") scheduleRefresh();
}

async function login(candidate) {
  token = candidate;
  try {
    me = await api("/v1/me");
  } catch (err) {
    me = null;
    showLogin(err instanceof ApiError && err.status !== 401 ? err.message : "That token was refused.");
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $("whoami").textContent = `${me.name} · ${me.role}${me.teams.length ? ` (${me.teams.join(", ")})` : ""}`;
  $("login").hidden = true;
  $("main").hidden = false;
  $("nav").hidden = false;
  $("logout").hidden = false;
  follow();
  render();
}

function showLogin(error = "") {
  $("login").hidden = false;
  $("main").hidden = true;
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("login-error").textContent = error;
}

function logout(error = "") {
  me = null;
  token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  if (stream) stream.abort();
  stream = null;
  $("live").className = "live off";
  $("whoami").textContent = "";
  showLogin(error);
}

$("login-form").addEventListener("submit", (e) => { e.preventDefault(); login($("token").value.trim()); });
$("logout").addEventListener("click", () => logout());
window.addEventListener("hashchange", render);
if (token) login(token); else showLogin();
