// Markdown to DOM nodes, never through HTML: every piece of model text reaches the page as a text node, so a reply
// holding <img onerror=...> or <script> shows as those characters. Links are made only for http(s) URLs.
// Covers what chat replies use: paragraphs, headings, lists, quotes, fenced code (with a copy button), inline
// code, bold, italic, links, and TeX math (math.js): $...$ and \(...\) inline, $$...$$ and \[...\] displayed, also
// as lines of their own. A $ must hug its formula ($x$, not "$5 and $10"), as in pandoc, and holds no backtick.
"use strict";

const Markdown = (() => {
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function safeUrl(url) {
    try {
      const u = new URL(url, "http://invalid.invalid/");
      return (u.protocol === "http:" || u.protocol === "https:") && /^https?:\/\//i.test(url) ? u.href : null;
    } catch (_) {
      return null;
    }
  }

  // Inline spans of one line of text: `code`, **bold**, *italic* / _italic_, [text](url), then math: $$display$$,
  // \(inline\), \[display\], $inline$. A formula holds no opener of its own kind, so a line of many unclosed \( is
  // scanned once, not once per opener.
  const INLINE = new RegExp([
    /(`+)([^`]|[^`][\s\S]*?[^`])\1/.source, /\*\*([^*]+)\*\*/.source, /\*([^*\s][^*]*)\*/.source,
    /\b_([^_]+)_\b/.source, /\[([^\]]+)\]\(([^)\s]+)\)/.source, /\$\$([^$]+?)\$\$/.source,
    /\\\(((?:[^\\]|\\(?!\())+?)\\\)/.source, /\\\[((?:[^\\]|\\(?!\[))+?)\\\]/.source, /\$([^\s$\\`]|[^\s$`][^$\n`]*?[^\s$\\`])\$(?![0-9])/.source,
  ].join("|"), "g");

  // A <math> for TeX source, or its text where math.js leaves it as written.
  function math(parent, tex, display, written) {
    const m = typeof TexMath !== "undefined" ? TexMath.render(tex, display) : null;
    parent.append(m || document.createTextNode(written));
  }

  function inline(parent, text) {
    let last = 0;
    for (const m of text.matchAll(INLINE)) {
      if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
      if (m[2] !== undefined) parent.append(el("code", null, m[2]));
      else if (m[3] !== undefined) inline(parent.appendChild(el("strong")), m[3]);
      else if (m[4] !== undefined) inline(parent.appendChild(el("em")), m[4]);
      else if (m[5] !== undefined) inline(parent.appendChild(el("em")), m[5]);
      else if (m[8] !== undefined) math(parent, m[8], true, m[0]);
      else if (m[9] !== undefined) math(parent, m[9], false, m[0]);
      else if (m[10] !== undefined) math(parent, m[10], true, m[0]);
      else if (m[11] !== undefined) math(parent, m[11], false, m[0]);
      else {
        const href = safeUrl(m[7]);
        if (href) {
          const a = el("a", null, m[6]);
          a.href = href;
          a.rel = "noopener noreferrer nofollow";
          a.target = "_blank";
          parent.append(a);
        } else {
          parent.append(document.createTextNode(m[0]));
        }
      }
      last = m.index + m[0].length;
    }
    if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
  }

  function codeBlock(lang, lines) {
    const pre = el("pre");
    const code = el("code", lang ? "lang-" + lang.replace(/[^\w-]/g, "") : null, lines.join("\n"));
    const copy = el("button", "copy", "Copy");
    copy.type = "button";
    copy.addEventListener("click", () => {
      const done = () => { copy.textContent = "Copied"; setTimeout(() => { copy.textContent = "Copy"; }, 1200); };
      if (navigator.clipboard) navigator.clipboard.writeText(code.textContent).then(done, () => {});
    });
    pre.append(copy, code);
    return pre;
  }

  // A fragment for a whole Markdown text (an unclosed fence, as while streaming, runs to the end).
  function render(text) {
    const out = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let para = [];
    let list = null;
    const flush = () => {
      if (para.length) {
        const p = el("p");
        para.forEach((line, i) => { if (i) p.append(el("br")); inline(p, line); });
        out.append(p);
        para = [];
      }
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)/);
      if (fence) {
        flush();
        list = null;
        const body = [];
        for (i++; i < lines.length && !lines[i].trimStart().startsWith(fence[1]); i++) body.push(lines[i]);
        out.append(codeBlock(fence[2], body));
        continue;
      }
      const display = line.match(/^\s*(\$\$|\\\[)\s*$/);
      if (display) { // a displayed formula on lines of its own (an unclosed one, as while streaming, runs to the end)
        flush();
        list = null;
        const end = display[1] === "$$" ? "$$" : "\\]";
        const body = [];
        for (i++; i < lines.length && lines[i].trim() !== end; i++) body.push(lines[i]);
        const written = [line, ...body, i < lines.length ? lines[i] : ""].join("\n");
        math(out.appendChild(el("div", "math")), body.join("\n"), true, written);
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
      const quote = line.match(/^>\s?(.*)$/);
      if (heading) {
        flush();
        list = null;
        inline(out.appendChild(el("h" + Math.min(heading[1].length + 2, 6))), heading[2]);
      } else if (item) {
        flush();
        const ordered = /\d/.test(item[1]);
        if (!list || list.ordered !== ordered) {
          list = { ordered, node: out.appendChild(el(ordered ? "ol" : "ul")) };
        }
        inline(list.node.appendChild(el("li")), item[2]);
      } else if (quote) {
        flush();
        list = null;
        inline(out.appendChild(el("blockquote")), quote[1]);
      } else if (!line.trim()) {
        flush();
        list = null;
      } else {
        list = null;
        para.push(line);
      }
    }
    flush();
    return out;
  }

  return { render, safeUrl };
})();
