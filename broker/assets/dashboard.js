// The kaas dashboard: polls this broker's JSON (/api/cluster, /api/actors,
// /api/partitions, /api/series) once a second and redraws. No framework, no
// network access beyond the broker (and the peers the user names). Every
// list is a page or an aggregate from the server, so a cluster with 10,000
// partitions costs the page the same as one with ten.
"use strict";

const POLL_MS = 1000;
const ACTOR_PAGE = 25;
const PART_PAGE = 50;
// The actor list starts on the partition leaders (what on-call looks for);
// clicking a kind switches, clicking it again shows every kind.
const state = { kind: "partition_leader", actorOffset: 0, partOffset: 0, topic: "", localOnly: false, updates: 0, peers: [] };

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (n, d = 0) => (n == null ? "–" : Number(n).toLocaleString(undefined, { maximumFractionDigits: d, minimumFractionDigits: 0 }));
const ms = (n) => (n == null ? "–" : n >= 10000 ? (n / 1000).toFixed(0) + " s" : n >= 1000 ? (n / 1000).toFixed(1) + " s" : n + " ms");
const bytes = (n) => {
  if (n == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
};

// The last three components of a path: the part that tells files apart.
const tail = (p) => { const parts = String(p || "").split("/"); return (parts.length > 3 ? "…/" : "") + parts.slice(-3).join("/"); };

// A stopped broker still accepts the connection (its listen backlog) and
// never answers: every request gives up after REQUEST_TIMEOUT_MS, and data
// older than STALE_MS turns the page stale (red, with its age) rather than
// showing the last render as if it were current.
const REQUEST_TIMEOUT_MS = 2000;
const STALE_MS = 3000;

async function getJson(url) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), REQUEST_TIMEOUT_MS);
  try {
    const r = await fetch(url, { cache: "no-store", signal: ctl.signal });
    if (!r.ok) throw new Error(url + ": " + r.status);
    return await r.json();
  } catch (e) {
    if (e.name === "AbortError") throw new Error(`${url}: no answer within ${REQUEST_TIMEOUT_MS / 1000} s`);
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

// When the page's own broker last answered every request of a poll.
let lastOk = null;
function markFreshness() {
  const age = lastOk == null ? null : performance.now() - lastOk.at;
  const stale = age == null || age > STALE_MS;
  document.body.classList.toggle("stale", stale && lastOk != null);
  document.body.dataset.stale = stale && lastOk != null ? "1" : "0";
  if (lastOk != null && stale) {
    $("status").textContent = `STALE: no answer from this broker for ${Math.round(age / 1000)} s; what is shown is from ${lastOk.clock}`;
    $("status").className = "bad";
  }
}

function rows(tbody, html) {
  const el = $(tbody).tBodies ? $(tbody).tBodies[0] : $(tbody);
  el.innerHTML = html;
}

// Cluster-level items of "needs attention": brokers dead now, and what
// changed in the last ATTENTION_MS (a lapse that is over, a dead broker, a
// controller change), newest first. Shown with the actors' items.
const ATTENTION_MS = 10 * 60 * 1000;
const EVENT_BADGE = { broker_dead: "dead", broker_back: "back", incarnation: "rejoined", controller: "controller" };

function clusterAttention(c) {
  const dead = c.brokers.filter((b) => !b.alive && !b.clean_exit).map((b) =>
    `<li class="hot cluster" data-event="dead-now"><span class="badge error">dead</span> <b>broker ${esc(b.id)}</b> no heartbeat for ${ms(b.lease_age_ms)}</li>`);
  const recent = (c.events || []).filter((e) => e.age_ms < ATTENTION_MS).reverse().map((e) =>
    `<li class="hot cluster" data-event="${esc(e.kind)}"><span class="badge ${e.kind === "broker_back" ? "controller" : "fenced"}">${esc(EVENT_BADGE[e.kind] || e.kind)}</span> ` +
    `${esc(e.text)} <span class="muted">${ms(e.age_ms)} ago</span></li>`);
  return dead.concat(recent);
}

function renderCluster(c) {
  state.clusterAttention = clusterAttention(c);
  $("whoami").textContent = `broker ${c.broker_id} · cluster ${c.cluster_id}`;
  const ctl = c.controller;
  const a = c.assignment;
  $("controller").innerHTML =
    `<span>controller <b id="controller-id">${ctl ? esc(ctl.broker_id) : "none"}</b> (epoch <b id="controller-epoch">${ctl ? esc(ctl.epoch) : "–"}</b>)</span>` +
    `<span>assignment v${esc(a.version)} by controller epoch ${esc(a.controller_epoch)}</span>` +
    `<span><b id="partitions-total">${num(a.partitions_total)}</b> partitions in ${num(a.topics_total)} topics` +
    (a.unassigned ? `, <span class="warn">${num(a.unassigned)} unassigned</span>` : "") + `</span>` +
    `<span>lease ${ms(c.lease.length_ms)} + grace ${ms(c.lease.grace_ms)}, this broker's headroom ${ms(c.lease.headroom_ms)}</span>` +
    (c.files_read_ms_ago != null && c.files_read_ms_ago > 5000 ? `<span class="bad">shared files last read ${ms(c.files_read_ms_ago)} ago</span>` : "");
  rows("brokers", c.brokers.map((b) => {
    const st = b.clean_exit ? '<span class="muted">exited</span>' : b.alive ? (b.shutting_down ? '<span class="warn">leaving</span>' : '<span class="ok">alive</span>') : '<span class="bad">dead</span>';
    const head = b.lease_headroom_ms;
    const headCls = !b.alive ? "muted" : head < c.lease.length_ms / 3 ? "bad" : "";
    return `<tr class="broker" data-id="${esc(b.id)}"><td>${esc(b.id)}${b.is_controller ? ' <span class="badge controller">controller</span>' : ""}${b.self ? ' <span class="muted">(this)</span>' : ""}</td>` +
      `<td>${esc(b.host)}:${esc(b.port)}</td><td>${st}${b.fenced ? ` <span class="badge fenced">${b.fenced} fenced</span>` : ""}</td>` +
      `<td class="num">${ms(b.lease_age_ms)}</td><td class="num ${headCls}">${b.alive ? ms(Math.max(0, head)) : "–"}</td>` +
      `<td class="num">${num(b.partitions_led)}</td><td class="num">${num(b.coordinators_led)}</td><td class="muted">${b.incarnation == null ? "" : esc(b.incarnation)}</td></tr>`;
  }).join(""));
  rows("topics", a.topics.map((t) => {
    const leaders = Object.entries(t.leaders).map(([k, v]) => `${k === "-1" ? "none" : k}: ${v}`).join(", ");
    return `<tr class="topic" data-topic="${esc(t.name)}"><td><a href="#" data-topic="${esc(t.name)}">${esc(t.name)}</a></td><td class="num">${num(t.partitions)}</td><td>${esc(leaders)}</td><td>${t.min_epoch === t.max_epoch ? esc(t.min_epoch) : esc(t.min_epoch) + "–" + esc(t.max_epoch)}</td></tr>`;
  }).join("") + (a.topics_total > a.topics.length ? `<tr><td colspan="4" class="muted">… ${num(a.topics_total - a.topics.length)} more topics (filter by name below)</td></tr>` : ""));
}

// Every group in the cluster, largest lag first, with its coordinator
// (groups coordinated by other brokers are read from them while the page
// is open, so they may take a poll or two to appear).
const LAG_PARTITIONS_SHOWN = 8;
function renderLag(l) {
  if (!l) return;
  const read = (l.peers_read || []).map((p) => `broker ${p.broker} read ${ms(p.read_ms_ago)} ago`).join(", ");
  $("lag-note").textContent = `(every group in the cluster: ${num(l.groups_total)} group${l.groups_total === 1 ? "" : "s"}` +
    `${l.groups_total > l.groups.length ? `, the ${l.groups.length} most behind shown` : ""}${read ? "; other coordinators: " + read : ""})`;
  if (!l.groups.length) { rows("lag", '<tr><td colspan="4" class="muted">no committed offsets yet</td></tr>'); return; }
  rows("lag", l.groups.map((g) => {
    const topics = g.topics.map((t) => {
      const ps = t.partitions.slice().sort((a, b) => b.lag - a.lag);
      const shown = ps.slice(0, LAG_PARTITIONS_SHOWN).map((p) => `p${esc(p.partition)} ${num(p.lag)}`).join(", ");
      const more = ps.length > LAG_PARTITIONS_SHOWN ? `, … ${num(ps.length - LAG_PARTITIONS_SHOWN)} more` : "";
      const unknown = t.unknown_partitions ? ` <span class="warn">(${num(t.unknown_partitions)} partitions' high watermark unknown)</span>` : "";
      return `${esc(t.topic)} <b>${num(t.lag)}</b> <span class="muted">[${shown}${more}]</span>${unknown}`;
    }).join("; ");
    return `<tr class="lag-group" data-group="${esc(g.group)}" data-lag="${esc(g.lag)}" data-coordinator="${esc(g.coordinator)}">` +
      `<td>${esc(g.group)}</td><td>broker ${esc(g.coordinator)}</td><td class="num">${num(g.lag)}</td><td>${topics}</td></tr>`;
  }).join(""));
}

function actorRow(r) {
  const hot = r.restarts > 0 || r.last_error || r.mailbox_depth >= 32;
  return `<tr class="actor${hot ? " hot" : ""}" data-kind="${esc(r.kind)}" data-id="${esc(r.id)}"><td>${esc(r.kind)}/${esc(r.id)}</td><td class="clip muted" title="${esc(r.owns)}">${esc(tail(r.owns))}</td>` +
    `<td class="num">${r.epoch < 0 ? "–" : esc(r.epoch)}</td><td class="num">${num(r.mailbox_depth)}</td><td class="num">${num(r.messages_per_sec, 1)}</td>` +
    `<td class="num">${num(r.handle_p50_ms, 2)}</td><td class="num">${num(r.handle_p99_ms, 2)}</td><td class="num ${r.restarts ? "bad" : ""}">${num(r.restarts)}</td>` +
    `<td class="clip ${r.last_error ? "bad" : ""}" title="${esc(r.last_error || "")}">${esc(r.last_error || "")}</td></tr>` +
    lagRow(r.consumer_lag);
}

// A coordinator's groups with the largest consumer lag, under its row.
function lagRow(lag) {
  if (!lag || !lag.topics.length) return "";
  const top = lag.topics.slice(0, 5).map((t) =>
    `${esc(t.group)} → ${esc(t.topic)}: <b>${num(t.lag)}</b>${t.unknown_partitions ? ` (+${num(t.unknown_partitions)} partitions whose high watermark is unknown)` : ""}`);
  const more = lag.total > top.length ? `, … ${num(lag.total - top.length)} more` : "";
  return `<tr class="lag"><td colspan="9" class="muted">consumer lag: ${top.join(", ")}${more}</td></tr>`;
}

function renderActors(a) {
  $("actors-broker").textContent = `(broker ${a.broker_id})`;
  rows("kinds", a.kinds.map((k) =>
    `<tr class="kind${state.kind === k.kind ? " selected" : ""}" data-kind="${esc(k.kind)}"><td>${esc(k.kind)}</td><td class="muted">${esc(k.supervisor)}</td>` +
    `<td class="num">${num(k.live)}</td><td class="num ${k.mailbox_depth >= 32 ? "warn" : ""}">${num(k.mailbox_depth)}</td>` +
    `<td class="num">${num(k.messages_per_sec, 1)}</td><td class="num ${k.restarts ? "bad" : ""}">${num(k.restarts)}</td></tr>`).join(""));
  $("actor-kind-label").textContent = state.kind ? `kind ${state.kind}` : "all kinds";
  const last = Math.min(a.offset + a.actors.length, a.total);
  $("actors-page").textContent = `${a.total ? a.offset + 1 : 0}–${last} of ${a.total}`;
  rows("actors", a.actors.map(actorRow).join(""));
  const hl = a.highlighted.map((h) =>
    `<li class="hot" data-kind="${esc(h.actor.kind)}">${h.why.map((w) => `<span class="badge ${esc(w)}">${esc(w)}</span>`).join("")} ` +
    `<b>${esc(h.actor.kind)}/${esc(h.actor.id)}</b> restarts ${num(h.actor.restarts)}, depth ${num(h.actor.mailbox_depth)}` +
    (h.actor.last_error ? ` — <span class="bad">${esc(h.actor.last_error)}</span>` : "") + `</li>`);
  const all = (state.clusterAttention || []).concat(hl);
  $("highlighted").innerHTML = all.length ? all.join("") : '<li class="muted">nothing restarted, fenced, dead or backing up</li>';
}

function renderPartitions(p) {
  const last = Math.min(p.offset + p.partitions.length, p.total);
  $("parts-page").textContent = `${p.total ? p.offset + 1 : 0}–${last} of ${num(p.total)}`;
  rows("partitions", p.partitions.map((r) => {
    const l = r.local;
    const x = r.remote || {};
    // Led elsewhere: log start and high watermark as read from the leader
    // (a poll or two after the row first appears); the rest is on its page.
    const cells = l
      ? `<td class="num">${num(l.log_start_offset)}</td><td class="num">${num(l.high_watermark)}</td><td class="num">${num(l.end_offset)}</td><td class="num">${num(l.segments)}</td>` +
        `<td class="num">${bytes(l.bytes)}</td><td class="num">${num(l.appends_per_sec, 1)}</td><td class="num">${num(l.fsyncs_per_sec, 1)}</td><td class="num">${num(l.fsync_p99_ms, 2)}</td>` +
        `<td class="num">${num(l.mailbox_depth)}</td>`
      : `<td class="num">${num(x.log_start_offset)}</td><td class="num">${num(x.high_watermark)}</td>` +
        `<td colspan="7" class="muted">read from broker ${esc(r.leader)}, which leads it; its end, segments and rates are on its page</td>`;
    return `<tr class="partition${l && (l.restarts || l.last_error) ? " hot" : ""}"><td>${esc(r.topic)}-${esc(r.partition)}</td><td>${esc(r.leader)}</td><td class="num">${esc(r.epoch)}</td>${cells}</tr>`;
  }).join(""));
}

function spark(label, values, fmt) {
  const w = 200, h = 36;
  const max = Math.max(1e-9, ...values);
  const step = values.length > 1 ? w / (values.length - 1) : w;
  const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`).join(" ");
  const cur = values.length ? values[values.length - 1] : 0;
  return `<div class="spark"><div class="label"><span>${esc(label)}</span><b>${fmt(cur)}</b></div>` +
    `<svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none"><polyline points="${pts}"/></svg></div>`;
}

function renderSeries(s) {
  const p = s.points;
  const col = (k) => p.map((x) => x[k]);
  $("sparks").innerHTML = [
    spark("actor messages/s", col("messages_per_sec"), (v) => num(v, 1)),
    spark("produce bytes/s", col("produce_bytes_per_sec"), bytes),
    spark("fetch bytes/s", col("fetch_bytes_per_sec"), bytes),
    spark("fsyncs/s", col("fsyncs_per_sec"), (v) => num(v, 1)),
    spark("mailbox depth", col("mailbox_depth"), (v) => num(v)),
    spark("restarts", col("restarts"), (v) => num(v)),
    spark("connections", col("connections"), (v) => num(v)),
    spark("lease headroom", col("lease_headroom_ms"), ms),
  ].join("");
}

async function renderPeers() {
  if (!state.peers.length) { $("peer-actors").innerHTML = ""; return; }
  const parts = await Promise.all(state.peers.map(async (peer) => {
    try {
      const a = await getJson(`http://${peer}/api/actors?limit=1`);
      return `<h3>broker ${esc(a.broker_id)} <span class="muted">${esc(peer)}</span></h3><table class="peer"><tbody>` +
        a.kinds.map((k) => `<tr><td>${esc(k.kind)}</td><td class="num">${num(k.live)} live</td><td class="num">depth ${num(k.mailbox_depth)}</td><td class="num">${num(k.messages_per_sec, 1)} msgs/s</td><td class="num ${k.restarts ? "bad" : ""}">${num(k.restarts)} restarts</td></tr>`).join("") +
        `</tbody></table>`;
    } catch (e) {
      return `<h3 class="bad">${esc(peer)}: unreachable</h3>`;
    }
  }));
  $("peer-actors").innerHTML = parts.join("");
}

let busy = false;
async function poll() {
  // A slow broker must not stack up requests: skip a tick instead.
  if (busy) return;
  busy = true;
  try { await pollOnce(); } finally { busy = false; }
}

async function pollOnce() {
  const t0 = performance.now();
  const partQ = `offset=${state.partOffset}&limit=${PART_PAGE}&topic=${encodeURIComponent(state.topic)}${state.localOnly ? "&local=1" : ""}`;
  const actQ = `offset=${state.actorOffset}&limit=${ACTOR_PAGE}&kind=${encodeURIComponent(state.kind)}`;
  try {
    const [c, a, p, s] = await Promise.all([
      getJson("/api/cluster"), getJson("/api/actors?" + actQ), getJson("/api/partitions?" + partQ), getJson("/api/series"),
    ]);
    renderCluster(c);
    renderLag(c.consumer_lag);
    renderActors(a);
    renderPartitions(p);
    renderSeries(s);
    // Fresh as of this broker's answers (a hung peer below only times out).
    lastOk = { at: performance.now(), clock: new Date().toLocaleTimeString() };
    markFreshness();
    await renderPeers();
    state.updates++;
    document.body.dataset.updates = String(state.updates);
    document.body.dataset.renderMs = String(Math.round(performance.now() - t0));
    $("status").textContent = `updated ${lastOk.clock} · ${Math.round(performance.now() - t0)} ms`;
    $("status").className = "muted";
    markFreshness();
  } catch (e) {
    $("status").textContent = `update failed: ${e.message}`;
    $("status").className = "bad";
    markFreshness();
  }
}

function wire() {
  $("kinds").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr.kind");
    if (!tr) return;
    state.kind = state.kind === tr.dataset.kind ? "" : tr.dataset.kind;
    state.actorOffset = 0;
    poll();
  });
  $("actors-prev").onclick = () => { state.actorOffset = Math.max(0, state.actorOffset - ACTOR_PAGE); poll(); };
  $("actors-next").onclick = () => { state.actorOffset += ACTOR_PAGE; poll(); };
  $("parts-prev").onclick = () => { state.partOffset = Math.max(0, state.partOffset - PART_PAGE); poll(); };
  $("parts-next").onclick = () => { state.partOffset += PART_PAGE; poll(); };
  $("topic-filter").addEventListener("change", (ev) => { state.topic = ev.target.value.trim(); state.partOffset = 0; poll(); });
  $("local-only").addEventListener("change", (ev) => { state.localOnly = ev.target.checked; state.partOffset = 0; poll(); });
  $("topics").addEventListener("click", (ev) => {
    const a = ev.target.closest("a[data-topic]");
    if (!a) return;
    ev.preventDefault();
    state.topic = a.dataset.topic;
    $("topic-filter").value = state.topic;
    state.partOffset = 0;
    poll();
  });
  const peers = new URLSearchParams(location.search).get("peers") || "";
  $("peers").value = peers;
  state.peers = peers.split(",").map((x) => x.trim()).filter(Boolean);
  $("peers").addEventListener("change", (ev) => {
    state.peers = ev.target.value.split(",").map((x) => x.trim()).filter(Boolean);
    const u = new URL(location.href);
    if (state.peers.length) u.searchParams.set("peers", state.peers.join(",")); else u.searchParams.delete("peers");
    history.replaceState(null, "", u);
    poll();
  });
}

wire();
poll();
setInterval(poll, POLL_MS);
// Independent of the polls (one may hang up to REQUEST_TIMEOUT_MS).
setInterval(markFreshness, 500);
