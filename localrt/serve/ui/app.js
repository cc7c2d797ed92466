// The chat page: conversations in localStorage, replies streamed from /api/chat (NDJSON), rendered by markdown.js
// (text nodes only). The API key, when the daemon asks for one (401), is asked once and kept for the tab.
"use strict";

const STORE_KEY = "localrt.conversations";
const KEY_KEY = "localrt.apiKey";
const $ = (id) => document.getElementById(id);

const state = { conversations: [], current: null, controller: null, builtins: [] };

// -- storage -------------------------------------------------------------------------------------------------
function load() {
  try {
    const got = JSON.parse(localStorage.getItem(STORE_KEY) || "[]");
    state.conversations = Array.isArray(got) ? got.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch (_) {
    state.conversations = [];
  }
}

function save() {
  localStorage.setItem(STORE_KEY, JSON.stringify(state.conversations));
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat",
              model: $("model").value, messages: [], created: new Date().toISOString() };
  state.conversations.unshift(c);
  state.current = c;
  save();
  renderAll();
}

function current() {
  if (!state.current) newConversation();
  return state.current;
}

// -- API -------------------------------------------------------------------------------------------------------
function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY_KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function api(path, init = {}) {
  for (let attempt = 0; attempt < 2; attempt++) {
    const r = await fetch(path, { ...init, headers: headers() });
    if (r.status !== 401) return r;
    const key = window.prompt("This localrt daemon needs its API key (LOCALRT_API_KEY):");
    if (!key) return r;
    sessionStorage.setItem(KEY_KEY, key.trim());
  }
  return fetch(path, { ...init, headers: headers() });
}

async function errorText(r) {
  const body = await r.text();
  try {
    const j = JSON.parse(body);
    return typeof j.error === "string" ? j.error : (j.error && j.error.message) || body;
  } catch (_) {
    return body || r.statusText;
  }
}

function setStatus(text, error = false) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

async function loadModels() {
  const select = $("model");
  const keep = select.value || (state.current && state.current.model);
  let names = [];
  try {
    const r = await api("/api/tags");
    if (!r.ok) throw new Error(await errorText(r));
    names = (await r.json()).models.map((m) => m.name);
    const cfg = await fetch("config.json").then((x) => x.json());
    state.builtins = cfg.builtins || [];
  } catch (e) {
    setStatus("Could not list models: " + e.message, true);
  }
  select.replaceChildren();
  const seen = new Set();
  for (const n of names.concat(state.builtins)) {
    if (seen.has(n)) continue;
    seen.add(n);
    const o = document.createElement("option");
    o.value = n;
    o.textContent = names.includes(n) ? n : n + " (built in)";
    select.append(o);
  }
  if (keep && seen.has(keep)) select.value = keep;
}

function options() {
  const out = {};
  for (const id of ["temperature", "num_ctx", "num_predict"]) {
    const v = $(id).value.trim();
    if (v !== "") out[id] = Number(v);
  }
  return out;
}

// -- sending -----------------------------------------------------------------------------------------------------
async function send(text) {
  const c = current();
  if (state.controller) return;
  if (text) {
    c.messages.push({ role: "user", content: text });
    if (c.title === "New chat") c.title = text.slice(0, 40);
  }
  c.model = $("model").value;
  const reply = { role: "assistant", content: "", thinking: "" };
  c.messages.push(reply);
  save();
  renderAll();
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of c.messages.slice(0, -1)) {
    if (m.role === "user" || m.role === "assistant") messages.push({ role: m.role, content: m.content });
  }
  const controller = new AbortController();
  state.controller = controller;
  busy(true);
  setStatus("Waiting for " + c.model + " (it may be loading, or busy with someone else's request)…");
  const node = $("messages").lastElementChild;
  try {
    const r = await api("/api/chat", { method: "POST", signal: controller.signal,
      body: JSON.stringify({ model: c.model, messages, stream: true, options: options() }) });
    if (!r.ok) {
      const why = await errorText(r);
      throw new Error(r.status === 503 ? "The daemon is busy or shutting down: " + why : why);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        const ev = JSON.parse(line);
        if (ev.error) throw new Error(ev.error);
        const m = ev.message || {};
        reply.content += m.content || "";
        reply.thinking += m.thinking || "";
        if (ev.done) {
          const secs = (ev.eval_duration || 0) / 1e9;
          reply.stats = `${ev.eval_count || 0} tokens` + (secs ? `, ${(ev.eval_count / secs).toFixed(1)} tokens/s` : "");
        }
        setStatus("Answering…");
        fill(node, reply);
      }
    }
    setStatus("");
  } catch (e) {
    if (e.name === "AbortError") {
      reply.stopped = true;
      setStatus("Stopped.");
    } else {
      reply.error = e.message;
      setStatus("Request failed: " + e.message, true);
    }
  } finally {
    state.controller = null;
    busy(false);
    save();
    renderAll();
  }
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("regenerate").disabled = on;
}

function regenerate() {
  const c = current();
  while (c.messages.length && c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
  if (c.messages.length) send(null);
}

function edit(index) {
  const c = current();
  $("prompt").value = c.messages[index].content;
  c.messages.splice(index);
  save();
  renderAll();
  $("prompt").focus();
}

// -- rendering ---------------------------------------------------------------------------------------------------
function fill(node, m) {
  const body = node.querySelector(".body");
  body.replaceChildren();
  if (m.thinking) {
    const d = document.createElement("details");
    d.className = "thinking";
    const s = document.createElement("summary");
    s.textContent = "Thinking";
    d.append(s, Markdown.render(m.thinking));
    body.append(d);
  }
  body.append(Markdown.render(m.content));
  if (m.error) node.classList.add("error");
  const note = m.error ? "Error: " + m.error : m.stopped ? "(stopped)" : m.stats || "";
  node.querySelector(".stats").textContent = note;
}

function messageNode(m, index) {
  const node = document.createElement("div");
  node.className = "msg " + m.role;
  const role = document.createElement("div");
  role.className = "role";
  const name = document.createElement("span");
  name.textContent = m.role === "user" ? "You" : state.current.model || "assistant";
  const tools = document.createElement("span");
  tools.className = "tools";
  if (m.role === "user") {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "edit";
    b.textContent = "Edit";
    b.addEventListener("click", () => edit(index));
    tools.append(b);
  }
  role.append(name, tools);
  const body = document.createElement("div");
  body.className = "body";
  const stats = document.createElement("div");
  stats.className = "stats";
  node.append(role, body, stats);
  fill(node, m);
  return node;
}

function renderAll() {
  const list = $("conversations");
  list.replaceChildren();
  for (const c of state.conversations) {
    const li = document.createElement("li");
    li.textContent = c.title;
    li.title = c.title;
    if (c === state.current) li.className = "active";
    li.addEventListener("click", () => {
      if (state.controller) return;
      state.current = c;
      if (c.model) $("model").value = c.model;
      renderAll();
    });
    list.append(li);
  }
  const box = $("messages");
  box.replaceChildren();
  if (state.current) state.current.messages.forEach((m, i) => box.append(messageNode(m, i)));
  box.scrollTop = box.scrollHeight;
}

function download(name, type, text) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], { type }));
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function asMarkdown(c) {
  const parts = [`# ${c.title}`, `Model: ${c.model || ""}`];
  for (const m of c.messages) parts.push(`## ${m.role}`, m.content);
  return parts.join("\n\n") + "\n";
}

// -- wiring ------------------------------------------------------------------------------------------------------
function wire() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("prompt").addEventListener("dragover", (e) => { e.preventDefault(); $("prompt").classList.add("dragging"); });
  $("prompt").addEventListener("dragleave", () => $("prompt").classList.remove("dragging"));
  $("prompt").addEventListener("drop", async (e) => {
    e.preventDefault();
    $("prompt").classList.remove("dragging");
    const f = e.dataTransfer.files[0];
    if (!f) return;
    if (f.size > 1 << 20) return setStatus(`${f.name} is larger than 1 MB`, true);
    const text = await f.text();
    if (text.includes("\u0000")) return setStatus(`${f.name} is not a text file`, true);
    $("prompt").value += (($("prompt").value ? "\n\n" : "") + `${f.name}:\n\n${text}`);
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("regenerate").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", () => !state.controller && newConversation());
  $("rename").addEventListener("click", () => {
    const c = state.current;
    const title = c && window.prompt("Rename this conversation:", c.title);
    if (title) { c.title = title.slice(0, 200); save(); renderAll(); }
  });
  $("delete").addEventListener("click", () => {
    const c = state.current;
    if (!c || state.controller || !window.confirm(`Delete "${c.title}"?`)) return;
    state.conversations = state.conversations.filter((x) => x !== c);
    state.current = state.conversations[0] || null;
    save();
    renderAll();
  });
  $("export-json").addEventListener("click", () => state.current &&
    download(state.current.title + ".json", "application/json", JSON.stringify(state.current, null, 2)));
  $("export-md").addEventListener("click", () => state.current &&
    download(state.current.title + ".md", "text/markdown", asMarkdown(state.current)));
  $("settings-toggle").addEventListener("click", () => {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!s.hidden));
  });
}

async function main() {
  load();
  state.current = state.conversations[0] || null;
  wire();
  await loadModels();
  if (state.current && state.current.model) $("model").value = state.current.model;
  renderAll();
  $("prompt").focus();
}

main();
