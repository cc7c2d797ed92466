// Conversations as stored data: localStorage (shared by the tabs of this origin) and the JSON files the page exports
// and imports. Everything read back, from storage or from a file, is untrusted: it is rebuilt field by field from the
// known keys with the right types (no object from JSON.parse is kept, so "__proto__" or any other key in it is
// dropped), lengths are bounded, and the text reaches the page only as text nodes (markdown.js). Storage that does
// not parse, or holds the wrong shapes, is read as what of it is usable; a file that does not is refused whole.
"use strict";

const Convs = (() => {
  const KEY = "localrt.conversations";
  const LIMITS = { file: 20 << 20, title: 200, model: 200, text: 2000000, stats: 200, messages: 5000, convs: 1000 };
  const ROLES = new Set(["user", "assistant", "system"]);
  const ID = /^[A-Za-z0-9_-]{1,40}$/;

  class Invalid extends Error {}

  const isObject = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

  // A string field: absent -> fallback; wrong type or too long -> refused (strict) or fallback / cut (lenient).
  function str(v, max, what, strict, fallback = "") {
    if (v === undefined || v === null) return fallback;
    if (typeof v !== "string") {
      if (strict) throw new Invalid(`${what} is not a string`);
      return fallback;
    }
    if (v.length > max) {
      if (strict) throw new Invalid(`${what} is longer than ${max} characters`);
      return v.slice(0, max);
    }
    return v;
  }

  function message(m, i, strict) {
    const what = `message ${i + 1}`;
    if (!isObject(m)) throw new Invalid(`${what} is not an object`);
    if (typeof m.role !== "string" || !ROLES.has(m.role)) throw new Invalid(`${what} has no valid role`);
    if (typeof m.content !== "string") throw new Invalid(`${what} has no text content`);
    const out = { role: m.role, content: str(m.content, LIMITS.text, `${what}'s content`, strict) };
    const thinking = str(m.thinking, LIMITS.text, `${what}'s thinking`, strict);
    if (thinking) out.thinking = thinking;
    for (const k of ["stats", "error", "model"]) {
      const v = str(m[k], k === "model" ? LIMITS.model : LIMITS.stats, `${what}'s ${k}`, strict);
      if (v) out[k] = v;
    }
    if (m.stopped === true) out.stopped = true;
    return out;
  }

  // One conversation rebuilt from untrusted data. strict: any flaw throws Invalid (imports); lenient: bad messages
  // are left out and bad fields take defaults, but a thing without a messages list is still refused (storage).
  function clean(c, strict) {
    if (!isObject(c)) throw new Invalid("a conversation is not an object");
    if (!Array.isArray(c.messages)) throw new Invalid("a conversation has no messages list");
    if (c.messages.length > LIMITS.messages) throw new Invalid(`more than ${LIMITS.messages} messages`);
    const messages = [];
    c.messages.forEach((m, i) => {
      try {
        messages.push(message(m, i, strict));
      } catch (e) {
        if (strict || !(e instanceof Invalid)) throw e;
      }
    });
    const id = typeof c.id === "string" && ID.test(c.id) ? c.id : null;
    if (strict && c.id !== undefined && id === null) throw new Invalid("the conversation's id is not a short name");
    const created = str(c.created, 40, "created", strict);
    return {
      id: id || newId(),
      title: str(c.title, LIMITS.title, "the title", strict, "Untitled") || "Untitled",
      model: str(c.model, LIMITS.model, "the model", strict),
      messages,
      created: created && !Number.isNaN(Date.parse(created)) ? created : new Date().toISOString(),
    };
  }

  // -- localStorage ------------------------------------------------------------------------------------------------
  function read() {
    let raw;
    try {
      raw = JSON.parse(localStorage.getItem(KEY) || "[]");
    } catch (_) {
      return [];
    }
    if (!Array.isArray(raw)) return [];
    const out = [];
    const ids = new Set();
    for (const c of raw.slice(0, LIMITS.convs)) {
      try {
        const got = clean(c, false);
        if (ids.has(got.id)) got.id = newId();
        ids.add(got.id);
        out.push(got);
      } catch (e) {
        if (!(e instanceof Invalid)) throw e;
      }
    }
    return out;
  }

  // Write `mine` (this tab's list, in its order) with what other tabs stored since that this tab does not know of,
  // except the ids this tab deleted. Returns the merged list, or throws when storage refuses (full, disabled).
  function write(mine, deleted) {
    const known = new Set(mine.map((c) => c.id));
    const theirs = read().filter((c) => !known.has(c.id) && !deleted.has(c.id));
    const all = mine.concat(theirs);
    localStorage.setItem(KEY, JSON.stringify(all));
    return all;
  }

  // -- files -------------------------------------------------------------------------------------------------------
  // A file as the page's export writes it (one conversation) or a list of them; refused whole on any flaw.
  async function parseFile(file, takenIds) {
    if (file.size > LIMITS.file) throw new Invalid(`${file.name} is larger than ${LIMITS.file >> 20} MB`);
    let raw;
    try {
      raw = JSON.parse(await file.text());
    } catch (_) {
      throw new Invalid(`${file.name} is not JSON`);
    }
    const list = Array.isArray(raw) ? raw : [raw];
    if (!list.length || list.length > LIMITS.convs) throw new Invalid(`${file.name} holds no conversations, or too many`);
    const out = list.map((c) => clean(c, true));
    for (const c of out) {
      if (takenIds.has(c.id)) c.id = newId();
      takenIds.add(c.id);
    }
    return out;
  }

  return { KEY, Invalid, clean, read, write, parseFile, newId };
})();
