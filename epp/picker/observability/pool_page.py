"""The `/debug/pool` page: one HTML document, its CSS and script inline, nothing fetched but the view.

The script loads `pool.json` (relative, so a path prefix in front of the metrics port keeps
working) every `REFRESH_MS`, and renders it with `textContent` only: adapter and model names
come from clients and are never parsed as markup. Every number shown is also on its element
as a `data-*` attribute, so a test or a script reads the page as exactly as the JSON. The
Content-Security-Policy allows this one script and style (by hash) and requests to the page's
own origin, nothing else.
"""

from __future__ import annotations

import base64
import hashlib

REFRESH_MS = 2000

STYLE = """
:root { --gpu: #d7f0d4; --host: #e6e6e6; --over: #ffd9a8; --bad: #f8d0d0; --plan: #2f6fd0; }
body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #1b1b1b; background: #fafafa; }
header { background: #243447; color: #fff; padding: 8px 16px; display: flex; gap: 18px;
  flex-wrap: wrap; align-items: baseline; }
header h1 { font-size: 16px; margin: 0; }
header .status[data-state="error"] { color: #ffb4b4; font-weight: bold; }
main { padding: 8px 16px 32px; }
h2 { font-size: 14px; margin: 18px 0 6px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #d0d0d0; padding: 3px 6px; vertical-align: top; text-align: left; }
th { background: #eef1f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.slot { min-width: 96px; }
td.slot.gpu { background: var(--gpu); }
td.slot.over { background: var(--over); }
td.slot.free { color: #888; border-style: dashed; }
td.slot.planned { box-shadow: inset 0 0 0 2px var(--plan); }
td.slot .inflight { float: right; font-weight: 600; }
td.slot .running { color: #1a7f2b; }
tr.not-ready td { background: var(--bad); }
tr.stale td.pod { color: #a05a00; }
.chip { display: inline-block; border-radius: 3px; padding: 0 4px; margin: 1px; background: var(--host); }
.chip.planned { outline: 1px solid var(--plan); }
.muted { color: #777; }
.bar { display: inline-block; height: 8px; background: #7aa6e0; vertical-align: middle; }
.legend > span { margin-right: 14px; }
"""

SCRIPT = """
"use strict";
const REFRESH_MS = __REFRESH_MS__;
const byId = (id) => document.getElementById(id);
let renders = 0;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const seconds = (s) => (s === null || s === undefined) ? "" : s.toFixed(s < 10 ? 2 : 1) + " s";
const list = (names) => names.length ? names.join(", ") : "";

function slotCell(entry, index, endpoint) {
  if (!entry) {
    return el("td", {class: "slot free", "data-slot": index, "data-tier": "gpu", "data-adapter": "",
      "data-in-flight": 0}, "free");
  }
  const over = endpoint.slots > 0 && index >= endpoint.slots;
  const classes = ["slot", over ? "over" : "gpu"];
  if (entry.planned_home) classes.push("planned");
  const notes = [];
  if (entry.running) notes.push("running");
  if (entry.waiting) notes.push("waiting");
  if (entry.waiting_for_slot) notes.push("waiting for a slot");
  if (entry.planned_home) notes.push("planned home");
  return el("td", {class: classes.join(" "), "data-slot": index, "data-tier": "gpu",
      "data-adapter": entry.adapter, "data-in-flight": entry.in_flight,
      "data-planned": entry.planned_home, "data-running": entry.running,
      "data-waiting-for-slot": entry.waiting_for_slot, title: notes.join(", ")},
    el("span", {class: "inflight", title: "in flight"}, entry.in_flight ? entry.in_flight : ""),
    el("span", {class: entry.running ? "running" : ""}, entry.adapter));
}

function renderGrid(view) {
  let width = 1;
  for (const pod of view.pods) {
    for (const ep of pod.endpoints) width = Math.max(width, ep.slots, ep.gpu.length);
  }
  const head = el("tr", {}, el("th", {}, "pod / endpoint"),
    Array.from({length: width}, (_, i) => el("th", {}, "GPU slot " + (i + 1))),
    el("th", {}, "host tier"), el("th", {}, "in flight"), el("th", {}, "running / waiting requests"),
    el("th", {}, "KV cache"));
  const rows = [];
  for (const pod of view.pods) {
    if (!pod.endpoints.length) {
      rows.push(el("tr", {class: "not-ready", "data-pod": pod.name, "data-ready": pod.ready},
        el("td", {class: "pod"}, el("b", {}, pod.name), " ", el("span", {class: "muted"}, pod.ip)),
        el("td", {colspan: width + 4},
          pod.deleting ? "deleting" : (pod.ready ? "no endpoint" : "not ready"))));
      continue;
    }
    for (const ep of pod.endpoints) {
      const cells = [];
      for (let i = 0; i < Math.max(width, ep.gpu.length); i++) {
        if (i < ep.gpu.length) cells.push(slotCell(ep.gpu[i], i, ep));
        else if (i < ep.slots) cells.push(slotCell(null, i, ep));
        else cells.push(el("td", {class: "muted"}));
      }
      const planned = new Set(
        view.adapters.filter((a) => a.planned_homes.includes(ep.name)).map((a) => a.name));
      const host = el("td", {class: "host", "data-tier": "host"}, ep.host.map((name) =>
        el("span", {class: planned.has(name) ? "chip planned" : "chip", "data-adapter": name,
          "data-tier": "host"}, name)));
      const kv = ep.kv_cache_usage;
      const label = pod.endpoints.length > 1 ? ep.name : pod.name;
      rows.push(el("tr", {class: [pod.ready ? "" : "not-ready", ep.fresh ? "" : "stale"].join(" ").trim(),
          "data-pod": pod.name, "data-endpoint": ep.name, "data-address": ep.address,
          "data-ready": pod.ready, "data-fresh": ep.fresh, "data-slots": ep.slots,
          "data-in-flight": ep.in_flight},
        el("td", {class: "pod"}, el("b", {}, label), " ", el("span", {class: "muted"}, ep.address),
          ep.fresh ? "" : el("div", {}, "stale " + seconds(ep.metrics_age_s) +
            (ep.last_error ? ": " + ep.last_error : ""))),
        cells, host,
        el("td", {class: "num", "data-in-flight": ep.in_flight,
          title: Object.entries(ep.in_flight_by_adapter).map(([a, n]) => a + ": " + n).join(", ")},
          ep.in_flight),
        el("td", {class: "num", "data-running": ep.running_requests, "data-waiting": ep.waiting_requests},
          (ep.running_requests ?? "?") + " / " + (ep.waiting_requests ?? "?")),
        el("td", {class: "num", "data-kv": kv}, kv === null ? "?" : [
          el("span", {class: "bar", "data-width": Math.round(kv * 60)}),
          " " + (kv * 100).toFixed(1) + "%"])));
    }
  }
  byId("grid").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  for (const bar of byId("grid").querySelectorAll(".bar")) bar.style.width = bar.dataset.width + "px";
}

function renderAdapters(view) {
  const head = el("tr", {}, ["adapter", "in flight", "GPU on", "host on", "waiting for a slot on",
    "planned homes", "traffic share"].map((t) => el("th", {}, t)));
  const rows = view.adapters.map((a) => el("tr", {"data-adapter": a.name, "data-in-flight": a.in_flight},
    el("td", {}, el("b", {}, a.name)),
    el("td", {class: "num", "data-in-flight": a.in_flight}, a.in_flight),
    el("td", {"data-gpu": a.gpu.join(" ")}, list(a.gpu)),
    el("td", {"data-host": a.host.join(" ")}, list(a.host)),
    el("td", {}, list(a.waiting_for_slot)),
    el("td", {"data-planned-homes": a.planned_homes.join(" ")}, list(a.planned_homes)),
    el("td", {class: "num", "data-share": a.traffic_share}, (a.traffic_share * 100).toFixed(1) + "%")));
  byId("adapters").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
}

function renderQueues(view) {
  const flow = view.flow_control;
  const box = byId("queues");
  if (!flow.enabled) {
    box.replaceChildren(el("p", {class: "muted", "data-enabled": false}, "Flow control is off."));
    return;
  }
  const bands = el("table", {id: "bands"}, el("thead", {}, el("tr", {},
      ["priority", "requests", "bytes", "flows", "oldest wait"].map((t) => el("th", {}, t)))),
    el("tbody", {},
      flow.bands.length ? [] : el("tr", {}, el("td", {colspan: 5, class: "muted"}, "no request waits")),
      flow.bands.map((b) => el("tr", {"data-priority": b.priority, "data-requests": b.requests},
      el("td", {class: "num"}, b.priority), el("td", {class: "num"}, b.requests),
      el("td", {class: "num"}, b.bytes), el("td", {class: "num"}, b.flows),
      el("td", {class: "num"}, seconds(b.oldest_wait_s))))));
  const lanes = el("table", {id: "lanes"}, el("thead", {}, el("tr", {},
      ["priority", "flow", "target model", "requests", "oldest wait", "total wait"]
        .map((t) => el("th", {}, t)))),
    el("tbody", {}, flow.lanes.map((l) => el("tr", {"data-requests": l.requests},
      el("td", {class: "num"}, l.priority), el("td", {}, l.fairness_id), el("td", {}, l.target_model),
      el("td", {class: "num"}, l.requests), el("td", {class: "num"}, seconds(l.oldest_wait_s)),
      el("td", {class: "num"}, seconds(l.total_wait_s))))));
  box.replaceChildren(
    el("p", {"data-enabled": true, "data-queued": flow.queued},
      flow.queued + " queued (" + flow.bytes + " bytes), gate: " + flow.capacity +
      ", TTL " + flow.request_ttl_s + " s"),
    bands,
    flow.lanes.length ? el("h3", {}, "Lanes that waited longest") : "",
    flow.lanes.length ? lanes : "");
}

function renderDecisions(view) {
  const head = el("tr", {}, ["age", "request", "model → target", "outcome", "chosen", "reason",
    "planned homes", "queued", "status"].map((t) => el("th", {}, t)));
  const rows = view.decisions.map((d) => el("tr", {"data-key": d.key, "data-outcome": d.outcome,
      "data-reason": d.reason},
    el("td", {class: "num"}, seconds(view.generated_at_s - d.at_s)),
    el("td", {}, d.request_id),
    el("td", {}, d.model === d.target_model ? d.model : d.model + " → " + d.target_model),
    el("td", {}, d.outcome),
    el("td", {"data-chosen": d.chosen.join(" ")}, list(d.chosen)),
    el("td", {}, d.reason),
    el("td", {}, list(d.planned_homes)),
    el("td", {class: "num"}, seconds(d.queue_wait_s)),
    el("td", {class: "num"}, d.response_status ?? "")));
  byId("decisions").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
}

function render(view) {
  renders += 1;
  const root = byId("view");
  root.dataset.version = view.version;
  root.dataset.generatedAt = view.generated_at_s;
  root.dataset.renders = renders;
  const pool = view.pool ? view.pool.namespace + "/" + view.pool.name : "(no pool)";
  let inFlight = 0;
  let ready = 0;
  for (const pod of view.pods) {
    if (pod.ready) ready += 1;
    for (const ep of pod.endpoints) inFlight += ep.in_flight;
  }
  byId("pool").textContent = pool;
  byId("scheduler").textContent = view.scheduler;
  const summary = byId("summary");
  summary.dataset.pods = view.pods.length;
  summary.dataset.ready = ready;
  summary.dataset.inFlight = inFlight;
  summary.textContent = ready + "/" + view.pods.length + " pods ready, " + inFlight + " in flight, " +
    (view.flow_control.enabled ? view.flow_control.queued + " queued" : "no queues");
  renderGrid(view);
  renderAdapters(view);
  renderQueues(view);
  renderDecisions(view);
}

function setStatus(state, text) {
  const status = byId("status");
  status.dataset.state = state;
  status.textContent = text;
}

async function refresh() {
  if (!byId("pause").checked) {
    const query = new URLSearchParams(location.search).get("decisions");
    const url = "pool.json" + (query === null ? "" : "?decisions=" + encodeURIComponent(query));
    try {
      const response = await fetch(url, {cache: "no-store", credentials: "same-origin"});
      if (!response.ok) throw new Error("HTTP " + response.status);
      render(await response.json());
      setStatus("ok", "updated " + new Date().toLocaleTimeString());
    } catch (err) {
      setStatus("error", "refresh failed: " + err.message);
    }
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();
""".replace("__REFRESH_MS__", str(REFRESH_MS))

BODY = """
<header>
  <h1>lora-epp pool <span id="pool"></span></h1>
  <span>scheduler <b id="scheduler"></b></span>
  <span id="summary"></span>
  <label><input type="checkbox" id="pause"> pause</label>
  <span id="status" class="status" data-state="loading">loading…</span>
</header>
<main id="view" data-renders="0">
  <h2>Pods and their LoRA slots</h2>
  <p class="legend muted">
    <span>GPU slots: the routing ledger's model, least recently used first, plus what the scrape shows
    running (<span class="running">green text</span>); the number is requests in flight there</span>
    <span>blue outline: a planned home</span><span>orange: over the slot count, waiting for a slot</span>
    <span>host tier: modelled, evicted from GPU</span>
  </p>
  <table id="grid"></table>
  <h2>Adapters</h2>
  <table id="adapters"></table>
  <h2>Flow-control queues</h2>
  <div id="queues"></div>
  <h2>Last decisions</h2>
  <table id="decisions"></table>
</main>
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE_HTML = (
    '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    f"<title>lora-epp pool</title>\n<style>{STYLE}</style>\n</head>\n<body>{BODY}"
    f"<script>{SCRIPT}</script>\n</body>\n</html>\n"
)

# Only this page's own script and style run; the only request it may make is to its own origin.
CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; script-src {_csp_hash(SCRIPT)}; style-src {_csp_hash(STYLE)}; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
