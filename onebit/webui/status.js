// The live view: every backend with its slots, tokens/s, KV cache and drafting, the queue, and
// per-user shares (names and counts only; the server never sends texts here). Polls once a second
// while the view is shown.

import { KeyRequired } from "./api.js";
import { LiveStats, takeSample } from "./live.js";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
const stats = new LiveStats();
let timer = null;
let loop = 0; // bumped on every start and stop: an older poll loop ends itself

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function rate(value) {
  return value === null || value === undefined ? "–" : value.toFixed(1);
}

function percent(fraction) {
  return `${(100 * fraction).toFixed(fraction > 0 && fraction < 0.1 ? 1 : 0)}%`;
}

function bar(fraction, label) {
  const box = el("div", "bar");
  box.title = label;
  const fill = el("div", "fill");
  fill.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  box.append(fill, el("span", "bar-label", label));
  return box;
}

function fact(label, value) {
  const box = el("div", "fact");
  box.append(el("span", "label", label));
  if (value instanceof Node) box.append(value);
  else box.append(el("span", "value", value));
  return box;
}

function row(cells, className) {
  const tr = el("tr", className);
  for (const cell of cells) tr.append(el(className === "head" ? "th" : "td", "", cell));
  return tr;
}

function drafting(backend, view) {
  const s = view.latest;
  if (!(backend.name in s.drafted)) return "off"; // no drafter: its counters are absent from /metrics
  const drafted = s.drafted[backend.name];
  if (!drafted) return "on, no drafts verified yet";
  const overall = (s.accepted[backend.name] || 0) / drafted;
  const recent = view.recentAcceptance[backend.name];
  const now = recent === undefined ? "" : `, last 3 s ${percent(recent)}`;
  return `${percent(overall)} of ${drafted} drafted tokens accepted${now}`;
}

function slotTable(slots, view) {
  const table = el("table", "slots");
  table.append(row(["slot", "state", "user", "request", "prompt tokens", "generated", "tokens/s"], "head"));
  for (const slot of slots) {
    const busy = Boolean(slot.is_processing);
    const key = `${slot.backend}/${slot.id}`;
    const tr = row([slot.id, busy ? "busy" : "idle", busy ? slot.user || "" : "", busy ? slot.id_task || "" : "",
      busy ? slot.n_prompt_tokens : "", busy ? slot.n_decoded : "", busy ? rate(view.slotRate[key]) : ""],
    `slot ${busy ? "busy" : "idle"}`);
    tr.dataset.state = busy ? "busy" : "idle";
    table.append(tr);
  }
  return table;
}

function backendCard(backend, slots, view) {
  const card = el("section", "backend card");
  card.dataset.backend = backend.name;
  const title = el("h2", "", backend.name);
  const where = [backend.kind, backend.device].filter(Boolean).join(" · ");
  title.append(el("span", "kind", where), el("span", `state state-${backend.state}`, backend.state));
  card.append(title);
  const s = backend.stats || {};
  const busy = slots.filter((slot) => slot.is_processing).length;
  const facts = el("div", "facts");
  facts.append(
    fact("tokens/s", rate(view.backendRate[backend.name])),
    fact("slots busy", `${busy} / ${slots.length}`),
    fact("reserved by the router", `${backend.in_flight ?? "–"} / ${backend.limit ?? "–"}`),
    fact("waiting in the engine", s.num_waiting ?? "–"),
    fact("KV cache", bar(s.kv_usage || 0, `${percent(s.kv_usage || 0)} of ${s.num_kv_blocks ?? "?"} blocks`)),
    fact("preemptions", s.num_preemptions ?? "–"),
    fact("speculative", drafting(backend, view)),
    fact("requests served", backend.served ?? "–"),
  );
  card.append(facts, slotTable(slots, view));
  return card;
}

function usersFromSlots(slots) {
  const users = new Map();
  for (const slot of slots) {
    if (!slot.is_processing || !slot.user) continue;
    const row = users.get(slot.user) || { user: slot.user, running: 0 };
    row.running += 1;
    users.set(slot.user, row);
  }
  return [...users.values()];
}

function usersView(view) {
  const queue = view.latest.queue;
  const box = el("div");
  if (!queue) {
    const fromSlots = usersFromSlots(view.latest.slots);
    box.append(el("p", "hint", "This server does not report users per request (no /queue route); "
      + "running requests by user from /slots:"));
    if (!fromSlots.length) box.append(el("p", "hint", "none with a user name right now."));
    else {
      const table = el("table", "users");
      table.append(row(["user", "running"], "head"));
      fromSlots.forEach((u) => table.append(row([u.user, u.running], "user-row")));
      box.append(table);
    }
    return box;
  }
  const users = queue.users || [];
  if (!users.length) {
    box.append(el("p", "hint", "No requests yet."));
    return box;
  }
  const served = users.reduce((sum, u) => sum + (u.tokens_served || 0), 0);
  const table = el("table", "users");
  table.append(row(["user", "running", "waiting", "requests", "tokens/s", "tokens served", "share"], "head"));
  for (const u of users) {
    const tr = row([u.user, u.running ?? 0, u.waiting ?? 0, u.requests ?? "–", rate(view.userRate[u.user]),
      u.tokens_served ?? "–", ""], "user-row");
    const share = served ? (u.tokens_served || 0) / served : 0;
    tr.lastChild.append(bar(share, percent(share)));
    table.append(tr);
  }
  box.append(table);
  if (queue.fair_share !== undefined) {
    box.append(el("p", "hint", queue.fair_share ? "Slots are shared fairly between users."
      : "Slots are given first come, first served."));
  }
  return box;
}

function render(view) {
  const { props, slots } = view.latest;
  const busy = slots.filter((slot) => slot.is_processing).length;
  $("total-rate").textContent = rate(view.total);
  $("busy-slots").textContent = `${busy} / ${slots.length}`;
  $("queue-length").textContent = `${props.queue_size ?? 0}` + (props.max_queue ? ` / ${props.max_queue}` : "");
  $("server-state").textContent = props.is_ready ? "ready" : "loading";
  const cards = (props.backends || []).map((backend) =>
    backendCard(backend, slots.filter((slot) => slot.backend === backend.name), view));
  $("backends").replaceChildren(...cards);
  $("users").replaceChildren(usersView(view));
  $("status-error").textContent = "";
}

async function poll(id) {
  try {
    const sample = await takeSample();
    if (id !== loop) return; // stopped or restarted meanwhile
    stats.add(sample);
    render(stats.view());
  } catch (error) {
    if (id !== loop) return;
    stats.reset();
    const keyless = error instanceof KeyRequired;
    $("status-error").textContent = keyless
      ? "The server needs an API key to show its state." : `Cannot read the server's state: ${error.message}`;
    if (keyless) return; // polling resumes when a key is given (app.js restarts it)
  }
  timer = setTimeout(() => poll(id), POLL_MS);
}

/** Start polling (the view is shown); a second call restarts at once. */
export function startStatus() {
  stopStatus();
  poll(loop);
}

/** Stop polling (the view is hidden). */
export function stopStatus() {
  loop += 1;
  clearTimeout(timer);
  timer = null;
  stats.reset();
}
