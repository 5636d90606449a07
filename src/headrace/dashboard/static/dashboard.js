// The headrace dashboard: polls /api/overview every second and redraws the graph, plots and table.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const PLOT_CONFIG = { displayModeBar: false, responsive: true };
const $ = (id) => document.getElementById(id);

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawGraph(graph, alerting) {
  const svg = el("svg:svg", { width: graph.width, height: graph.height, class: "topology", "data-topology": graph.name });
  const defs = el("svg:defs");
  const marker = el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
  marker.append(el("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: "#8d96a8" }));
  defs.append(marker);
  svg.append(defs);
  const at = Object.fromEntries(graph.nodes.map((n) => [n.id, n]));
  for (const [a, b] of graph.edges) {
    const from = at[a], to = at[b];
    const x1 = from.x + from.width, y1 = from.y + from.height / 2, x2 = to.x, y2 = to.y + to.height / 2;
    const mid = (x1 + x2) / 2;
    svg.append(el("svg:path", { class: "edge", d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, "marker-end": "url(#arrow)" }));
  }
  for (const n of graph.nodes) {
    const g = el("svg:g", { class: `node ${n.kind}${alerting.has(n.id) ? " alert" : ""}`, "data-name": n.label });
    if (n.kind === "injector") {
      g.append(el("svg:ellipse", { cx: n.x + n.width / 2, cy: n.y + n.height / 2, rx: n.width / 2, ry: n.height / 2 }));
    } else {
      g.append(el("svg:rect", { x: n.x, y: n.y, width: n.width, height: n.height, rx: n.kind === "stream" ? 14 : 3 }));
    }
    const label = n.label.length > 18 ? n.label.slice(0, 17) + "…" : n.label;
    g.append(el("svg:text", { x: n.x + n.width / 2, y: n.y + n.height / 2 + 4, "text-anchor": "middle" }, label));
    g.append(el("svg:title", {}, `${n.kind} ${n.label}`));
    svg.append(g);
  }
  return svg;
}

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

// One trace per stage, in the topology's order, each stage in the same colour on every plot.
function lines(series, field, scale, order, times = "t") {
  return order.filter((name) => series[name] && series[name][times].length).map((name) => {
    const s = series[name], color = PALETTE[order.indexOf(name) % PALETTE.length];
    return {
      name, type: "scatter", mode: "lines+markers", marker: { size: 4, color }, line: { color, width: 1.6 },
      x: s[times].map((t) => new Date(t)),
      y: s[field].map((v) => (v === null || v === undefined ? null : v * scale)),
    };
  });
}

function plot(id, title, traces, yaxis) {
  const layout = {
    title: { text: title, font: { size: 13 } }, margin: { l: 60, r: 10, t: 32, b: 32 },
    xaxis: { type: "date" }, yaxis: Object.assign({ rangemode: "tozero" }, yaxis || {}),
    legend: { orientation: "h", y: -0.22, font: { size: 10 } }, uirevision: id,
  };
  Plotly.react($(id), traces, layout, PLOT_CONFIG);
}

function mark(v) {
  if (v === null || v === undefined) return "";
  if (v >= 9e18) return "end of time";
  if (v <= -9e18) return "beginning";
  const text = new Date(v).toISOString().replace("T", " ").replace("Z", "");
  return Math.abs(v - Date.now()) < 86400000 ? text.slice(11) : text;  // within a day: the time is enough
}

const ms = (v) => (v === null || v === undefined ? "" : v >= 10000 ? `${(v / 1000).toFixed(1)} s` : `${v} ms`);
const owners = (s) => (s.owners || []).filter((o) => o.live).length + "/" + (s.owners || []).length;

const COLUMNS = [
  ["kind", (s) => s.kind],
  ["input watermark", (s) => mark(s.input_watermark)],
  ["output watermark", (s) => mark(s.output_watermark)],
  ["lag (wall clock)", (s) => ms(s.watermark_lag_ms)],
  ["lag (producers)", (s) => ms(s.producer_lag_ms)],
  ["records/s", (s) => (s.records_per_s === null || s.records_per_s === undefined ? "" : Math.round(s.records_per_s))],
  ["records", (s) => s.records],
  ["backlog", (s) => s.backlog_records],
  ["batches", (s) => s.batches],
  ["late dropped/delivered", (s) => (s.kind === "computation" ? `${s.late_dropped} / ${s.late_delivered}` : "")],
  ["dead letters", (s) => s.dead_letters],
  ["live owners", (s) => (s.kind === "computation" ? owners(s) : "")],
  ["alert", (s) => (s.alert ? `lag ${ms(s.alert.lag_ms)} > ${ms(s.alert.threshold_ms)}` : "")],
  ["last error", (s) => (s.last_error ? `${s.last_error.type}: ${s.last_error.message}`.slice(0, 90) : "")],
];

function drawTable(rows) {
  const head = $("stages").tHead, body = $("stages").tBodies[0];
  head.replaceChildren(el("tr"));
  for (const h of ["stage", ...COLUMNS.map((c) => c[0])]) head.rows[0].append(el("th", {}, h));
  body.replaceChildren();
  for (const [name, s] of rows) {
    const tr = el("tr", { "data-stage": name, class: `${s.kind}${s.alert ? " alert" : ""}` });
    tr.append(el("td", {}, name));
    for (const [, get] of COLUMNS) {
      const v = get(s);
      tr.append(el("td", {}, v === undefined || v === null ? "" : typeof v === "number" ? v.toLocaleString() : String(v)));
    }
    body.append(tr);
  }
}

function drawRebalancing(decisions) {
  const items = decisions.map((d) => el("li", {}, `${new Date(d.at).toLocaleTimeString()}: ` + (d.kind === "move"
    ? `moved ${d.computation}/${d.shard} from ${d.source} to ${d.target}`
    : `rescaled ${d.computation} from ${d.old} to ${d.new} intervals`)));
  $("rebalanced").replaceChildren(...(items.length ? items : [el("li", {}, "No interval has been moved.")]));
}

function fillLookup(topologies) {
  const select = $("lookup-computation");
  const names = topologies.flatMap((t) => t.graph.nodes.filter((n) => n.kind === "computation").map((n) => n.label));
  if (select.options.length === names.length) return;
  select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
}

async function poll() {
  try {
    const response = await fetch("/api/overview", { cache: "no-store" });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || response.statusText);
    const rows = Object.entries(data.status.stages);
    const alerting = new Set(rows.filter(([, s]) => s.alert).map(([n]) => n));
    $("store").textContent = data.store;
    $("graphs").replaceChildren(...data.topologies.map((t) => drawGraph(t.graph, alerting)));
    if (!data.topologies.length) $("graphs").textContent = "No topology has run on this store yet.";
    const merged = (part) => Object.assign({}, ...data.topologies.map((t) => t.history[part]));
    const marks = merged("watermarks"), rates = merged("throughput");
    const order = data.topologies.flatMap((t) => t.stages);
    plot("plot-watermark", "Low watermark (event time)", lines(marks, "watermark", 1, order), { type: "date", rangemode: "normal" });
    plot("plot-lag", "Watermark lag behind the injectors (s)", lines(marks, "lag_ms", 0.001, order, "lag_t"));
    plot("plot-throughput", "Records/s", lines(rates, "records_per_s", 1, order));
    plot("plot-backlog", "Backlog (records not yet processed)", lines(rates, "backlog", 1, order));
    drawTable(rows);
    drawRebalancing(data.status.rebalanced || []);
    fillLookup(data.topologies);
    $("updated").textContent = "updated " + new Date(data.now_ms).toLocaleTimeString();
    $("problem").hidden = true;
  } catch (err) {
    $("problem").textContent = "Cannot read the store: " + err.message;
    $("problem").hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

function showLookup(result) {
  const box = $("lookup-result");
  if (result.error) {
    box.replaceChildren(el("p", { class: "problem" }, result.error));
    return;
  }
  const timers = el("table", { id: "lookup-timers" });
  timers.append(el("tr"));
  for (const h of ["tag", "domain", "timestamp"]) timers.rows[0].append(el("th", {}, h));
  for (const t of result.timers) {
    const tr = el("tr");
    for (const v of [t.tag, t.domain, t.timestamp]) tr.append(el("td", {}, String(v)));
    timers.append(tr);
  }
  box.replaceChildren(
    el("h3", {}, `${result.computation} / ${result.key}`),
    el("pre", { id: "lookup-state" }, JSON.stringify(result.state, null, 1)),
    el("p", {}, `${result.timers.length} pending timer(s)`),
    timers,
  );
}

$("lookup").addEventListener("submit", async (event) => {
  event.preventDefault();
  const query = new URLSearchParams(new FormData(event.target));
  const response = await fetch("/api/key?" + query, { cache: "no-store" });
  showLookup(await response.json());
});

poll();
