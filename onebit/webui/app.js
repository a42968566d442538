// The page's entry: tabs (#chat, #status), the API key prompt, and finding the served model.

import { KeyRequired, getJSON, getKey, onKeyRequired, setKey } from "./api.js";
import { initChat, setModel } from "./chat.js";
import { initSettings } from "./settings.js";
import { startStatus, stopStatus } from "./status.js";

const $ = (id) => document.getElementById(id);
const RETRY_MS = 2000;
let retry = null;

function showView(name) {
  for (const tab of document.querySelectorAll(".tab")) {
    const on = tab.dataset.view === name;
    tab.setAttribute("aria-selected", String(on));
    $(`view-${tab.dataset.view}`).hidden = !on;
  }
  if (name === "status") startStatus();
  else stopStatus();
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
}

function currentView() {
  return location.hash === "#status" ? "status" : "chat";
}

function askForKey(refused) {
  $("key-banner").hidden = false;
  $("key-error").textContent = refused && getKey() ? "That key was refused." : "";
  $("connection").textContent = "API key needed";
  $("connection").dataset.state = "key";
}

/** Find the served model (this also checks the key); retry while the server loads. */
async function connect() {
  clearTimeout(retry);
  try {
    const models = await getJSON("/v1/models");
    const id = models.data && models.data.length ? models.data[0].id : null;
    setModel(id);
    $("model-name").textContent = id || "no model";
    $("key-banner").hidden = true;
    $("connection").textContent = "connected";
    $("connection").dataset.state = "ok";
    if (currentView() === "status") startStatus();
  } catch (error) {
    if (error instanceof KeyRequired) return; // askForKey already ran
    $("connection").textContent = `not ready: ${error.message}`;
    $("connection").dataset.state = "error";
    retry = setTimeout(connect, RETRY_MS);
  }
}

function useKey(key) {
  setKey(key.trim());
  $("set-key").value = getKey();
  connect();
}

function init() {
  initSettings();
  initChat();
  onKeyRequired(() => askForKey(true));
  $("set-key").value = getKey();
  $("set-key").addEventListener("change", () => useKey($("set-key").value));
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    useKey($("key-input").value);
    $("key-input").value = "";
  });
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => showView(tab.dataset.view));
  }
  window.addEventListener("hashchange", () => showView(currentView()));
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) stopStatus();
    else if (currentView() === "status") startStatus();
  });
  showView(currentView());
  connect();
}

init();
