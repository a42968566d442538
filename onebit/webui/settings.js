// The chat's sampling settings, kept in localStorage, and the request fields they make.

const STORAGE = "onebit.settings";
const DEFAULTS = { system: "", temperature: "0.8", top_p: "0.95", max_tokens: "512", seed: "", extra: "" };
const FIELDS = Object.keys(DEFAULTS);

function input(name) {
  return document.getElementById(`set-${name}`);
}

function load() {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(STORAGE) || "{}") };
  } catch (_) {
    return { ...DEFAULTS };
  }
}

/** Fill the settings panel from storage and save every change. */
export function initSettings() {
  const saved = load();
  for (const name of FIELDS) {
    const field = input(name);
    field.value = saved[name];
    field.addEventListener("input", () => {
      const now = load();
      now[name] = field.value;
      localStorage.setItem(STORAGE, JSON.stringify(now));
    });
  }
}

function number(name, parse) {
  const text = input(name).value.trim();
  if (!text) return undefined;
  const value = parse(text);
  if (!Number.isFinite(value)) throw new Error(`${name} is not a number: ${text}`);
  return value;
}

/** The system prompt from the panel ("" when none). */
export function systemPrompt() {
  return input("system").value.trim();
}

/** Request fields from the panel (empty fields are left to the server's defaults); throws on a
 *  value that is not a number or extra fields that are not a JSON object. */
export function requestFields() {
  const fields = {
    temperature: number("temperature", parseFloat),
    top_p: number("top_p", parseFloat),
    max_tokens: number("max_tokens", (t) => parseInt(t, 10)),
    seed: number("seed", (t) => parseInt(t, 10)),
  };
  for (const key of Object.keys(fields)) if (fields[key] === undefined) delete fields[key];
  const extra = input("extra").value.trim();
  if (extra) {
    let parsed;
    try {
      parsed = JSON.parse(extra);
    } catch (error) {
      throw new Error(`extra request fields: ${error.message}`);
    }
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
      throw new Error("extra request fields must be a JSON object");
    }
    Object.assign(fields, parsed);
  }
  return fields;
}
