// The chat page: conversations in localStorage (convs.js: validated on the way in, shared with the other tabs),
// replies streamed from /api/chat (NDJSON), rendered by markdown.js (text nodes only). The API key, when the daemon
// asks for one (401), is asked once and kept for the tab.
"use strict";

const KEY_KEY = "localrt.apiKey";
const $ = (id) => document.getElementById(id);

const state = { conversations: [], current: null, controller: null, builtins: [], deleted: new Set() };

// -- storage -------------------------------------------------------------------------------------------------
function load() {
  state.conversations = Convs.read();
}

function save() {
  try {
    state.conversations = Convs.write(state.conversations, state.deleted);
  } catch (e) {
    setStatus("Could not save the conversations in this browser: " + e.message, true);
  }
}

// Another tab saved: take its list, keeping this tab's own object for the open conversation (a reply may be
// streaming into it). Only the list is drawn again, so a reply streaming here keeps its node.
function otherTabSaved(e) {
  if (e.key !== Convs.KEY && e.key !== null) return;
  const open = state.current;
  state.conversations = Convs.read().filter((c) => !state.deleted.has(c.id))
    .map((c) => (open && c.id === open.id ? open : c));
  if (open && !state.conversations.includes(open)) state.conversations.unshift(open);
  renderList();
}

function newConversation() {
  const c = { id: Convs.newId(), title: "New chat", model: $("model").value, messages: [],
              created: new Date().toISOString() };
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

// Shows `name` in the picker where it is one of its models (a stored or imported name may not be).
function pickModel(name) {
  if (name && Array.from($("model").options).some((o) => o.value === name)) $("model").value = name;
}

function options() {
  const out = {};
  for (const id of ["temperature", "num_ctx", "num_predict"]) {
    const v = $(id).value.trim();
    if (v !== "") out[id] = Number(v);
  }
  return out;
}

// -- waiting -----------------------------------------------------------------------------------------------------
// Until the first event of a reply: what the daemon is doing meanwhile, polled from GET /api/ps (is the model
// loaded yet) and GET /api/kernels (is it compiling kernels for this CPU, a one-time step that can take minutes).
// Returns the function that stops the polling.
function watchWait(model) {
  const began = Date.now();
  let stopped = false;
  let base = null;
  let timer = null;
  const get = (path) => fetch(path, { headers: headers() }).then((r) => (r.ok ? r.json() : null)).catch(() => null);
  async function tick() {
    const [ps, k] = await Promise.all([get("/api/ps"), get("/api/kernels")]);
    if (stopped) return;
    const secs = Math.round((Date.now() - began) / 1000);
    if (k && typeof k.compiled === "number" && base === null) base = k.compiled;
    const done = k && base !== null ? k.compiled - base : 0;
    const loaded = ps && Array.isArray(ps.models) && ps.models.some((m) => m && (m.name === model || m.model === model));
    if (k && (k.compiling || done > 0)) {
      const now = k.compiling && typeof k.kernel === "string" ? `, now ${k.kernel}` : "";
      setStatus(`Preparing kernels for this CPU (first run only): ${done} compiled${now}, ${secs} s…`);
    } else if (ps && !loaded) {
      setStatus(`Loading ${model}… ${secs} s`);
    } else if (ps) {
      setStatus(`Waiting for ${model} (reading the prompt, or queued behind other requests)… ${secs} s`);
    }
    timer = setTimeout(tick, 500);
  }
  timer = setTimeout(tick, 0);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
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
  const reply = { role: "assistant", content: "", thinking: "", model: c.model };
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
  setStatus("Waiting for " + c.model + "…");
  const node = $("messages").lastElementChild;
  const stopWatching = watchWait(c.model);
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
        stopWatching();
        if (ev.error) throw new Error(ev.error);
        if (typeof ev.model === "string") reply.model = ev.model;
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
    stopWatching();
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
  name.textContent = m.role === "user" ? "You" : m.model || state.current.model || "assistant";
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
  renderList();
  const box = $("messages");
  box.replaceChildren();
  if (state.current) state.current.messages.forEach((m, i) => box.append(messageNode(m, i)));
  box.scrollTop = box.scrollHeight;
}

function renderList() {
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
      pickModel(c.model);
      renderAll();
    });
    list.append(li);
  }
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

async function importFiles(e) {
  const files = Array.from(e.target.files || []);
  e.target.value = "";
  const taken = new Set(state.conversations.map((c) => c.id));
  try {
    const got = [];
    for (const f of files) got.push(...(await Convs.parseFile(f, taken)));
    if (!got.length) return;
    state.conversations = got.concat(state.conversations);
    got.forEach((c) => state.deleted.delete(c.id));
    state.current = got[0];
    save();
    pickModel(state.current.model);
    renderAll();
    setStatus(`Imported ${got.length} conversation${got.length > 1 ? "s" : ""}.`);
  } catch (err) {
    if (!(err instanceof Convs.Invalid)) throw err;
    setStatus("Not imported: " + err.message, true);
  }
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
    state.deleted.add(c.id);
    state.conversations = state.conversations.filter((x) => x !== c);
    state.current = state.conversations[0] || null;
    save();
    renderAll();
  });
  $("export-json").addEventListener("click", () => state.current &&
    download(state.current.title + ".json", "application/json", JSON.stringify(state.current, null, 2)));
  $("import-json").addEventListener("click", () => !state.controller && $("import-file").click());
  $("import-file").addEventListener("change", importFiles);
  $("model").addEventListener("change", () => {  // the next message goes to the model picked (send reads it too)
    if (state.current && !state.controller) { state.current.model = $("model").value; save(); }
  });
  window.addEventListener("storage", otherTabSaved);
  // A tab closed or navigated away mid-reply ends its request, so the daemon cancels the generation at once.
  window.addEventListener("pagehide", () => state.controller && state.controller.abort());
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
  if (state.current) pickModel(state.current.model);
  renderAll();
  $("prompt").focus();
}

main();
