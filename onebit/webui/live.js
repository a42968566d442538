// One sample of the server's state from /props, /slots, /metrics and /queue, and the rates
// between samples: tokens/s per slot, per backend and in total, recent draft acceptance.

import { ApiError, getJSON, getText } from "./api.js";
import { parseMetrics, sumBy } from "./prometheus.js";

const WINDOW_MS = 3000; // rates over the last ~3 s: steadier than one poll apart

let queueRoute = true; // false once /queue answered 404 (a server without it)

async function fetchQueue() {
  if (!queueRoute) return null;
  try {
    return await getJSON("/queue");
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      queueRoute = false;
      return null;
    }
    throw error;
  }
}

/** Read the server once: {t, props, slots, queue, finished, drafted, accepted}. */
export async function takeSample() {
  const [props, slots, text, queue] = await Promise.all([
    getJSON("/props"),
    getJSON("/slots"),
    getText("/metrics"),
    fetchQueue(),
  ]);
  const metrics = parseMetrics(text);
  return {
    t: performance.now(),
    props,
    slots,
    queue,
    // Tokens of finished requests: the front counts a request's tokens when it ends.
    finished: sumBy(metrics, "onebit:generation_tokens_total", "backend"),
    drafted: sumBy(metrics, "onebit:spec_decode_num_draft_tokens_total", "backend"),
    accepted: sumBy(metrics, "onebit:spec_decode_num_accepted_tokens_total", "backend"),
  };
}

function slotKey(slot) {
  return `${slot.backend}/${slot.id}`;
}

/** Tokens generated so far per backend: finished requests plus what running slots decoded. */
function generated(sample) {
  const out = { ...sample.finished };
  for (const slot of sample.slots) {
    if (slot.is_processing) out[slot.backend] = (out[slot.backend] || 0) + (slot.n_decoded || 0);
  }
  return out;
}

function perSecond(now, then, seconds) {
  return seconds > 0 ? Math.max(0, (now - then) / seconds) : 0;
}

/** Keeps recent samples and derives the rates the live view shows. */
export class LiveStats {
  constructor() {
    this.samples = [];
  }

  add(sample) {
    this.samples.push(sample);
    while (this.samples.length > 2 && sample.t - this.samples[1].t >= WINDOW_MS) this.samples.shift();
  }

  reset() {
    this.samples = [];
  }

  /** {latest, slotRate: {key: tok/s}, backendRate: {name: tok/s}, total, recentAcceptance: {name: 0-1},
   *  userRate: {user: tokens/s served}}; rates are null until two samples exist. */
  view() {
    const latest = this.samples[this.samples.length - 1];
    const first = this.samples[0];
    const seconds = latest && first !== latest ? (latest.t - first.t) / 1000 : 0;
    const out = { latest, slotRate: {}, backendRate: {}, total: null, recentAcceptance: {}, userRate: {} };
    if (!seconds) return out;
    const before = new Map(first.slots.map((slot) => [slotKey(slot), slot]));
    for (const slot of latest.slots) {
      const old = before.get(slotKey(slot));
      if (slot.is_processing && old && old.is_processing && old.id_task === slot.id_task) {
        out.slotRate[slotKey(slot)] = perSecond(slot.n_decoded, old.n_decoded, seconds);
      }
    }
    const now = generated(latest);
    const then = generated(first);
    out.total = 0;
    for (const name of Object.keys(now)) {
      out.backendRate[name] = perSecond(now[name], then[name] || 0, seconds);
      out.total += out.backendRate[name];
    }
    for (const name of Object.keys(latest.drafted)) {
      const drafted = latest.drafted[name] - (first.drafted[name] || 0);
      if (drafted > 0) out.recentAcceptance[name] = (latest.accepted[name] - (first.accepted[name] || 0)) / drafted;
    }
    const usersBefore = new Map(((first.queue && first.queue.users) || []).map((u) => [u.user, u]));
    for (const user of (latest.queue && latest.queue.users) || []) {
      const old = usersBefore.get(user.user);
      if (old) out.userRate[user.user] = perSecond(user.tokens_served || 0, old.tokens_served || 0, seconds);
    }
    return out;
  }
}
