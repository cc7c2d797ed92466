// TeX math to MathML nodes, built with createElementNS and text nodes only (never HTML): the subset chat replies
// use. Letters, numbers and operators; ^ and _ (msup / msub / msubsup, and under/over for \sum-like operators);
// {groups}; \frac \dfrac \tfrac, \sqrt and \sqrt[n]; \left( ... \right); \text \mathrm \mathbf \mathit \operatorname;
// Greek letters and the common symbols below. A command outside the subset shows as its own text, so nothing a
// model writes can fail the page; a formula too long or too deep is left as written. The browser lays MathML out
// (Chromium since 109): no font or script is fetched.
"use strict";

const TexMath = (() => {
  const NS = "http://www.w3.org/1998/Math/MathML";
  const MAX_LENGTH = 4000; // characters of one formula
  const MAX_DEPTH = 40; // nested groups, fractions and scripts

  const GREEK = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ϵ", varepsilon: "ε", zeta: "ζ", eta: "η", theta: "θ",
    vartheta: "ϑ", iota: "ι", kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ", pi: "π", varpi: "ϖ", rho: "ρ",
    varrho: "ϱ", sigma: "σ", varsigma: "ς", tau: "τ", upsilon: "υ", phi: "ϕ", varphi: "φ", chi: "χ", psi: "ψ",
    omega: "ω", Gamma: "Γ", Delta: "Δ", Theta: "Θ", Lambda: "Λ", Xi: "Ξ", Pi: "Π", Sigma: "Σ", Upsilon: "Υ",
    Phi: "Φ", Psi: "Ψ", Omega: "Ω", ell: "ℓ", hbar: "ℏ", infty: "∞", partial: "∂", nabla: "∇", emptyset: "∅",
    aleph: "ℵ", Re: "ℜ", Im: "ℑ",
  };
  const OPERATORS = {
    pm: "±", mp: "∓", times: "×", div: "÷", cdot: "⋅", ast: "∗", star: "⋆", circ: "∘", bullet: "∙",
    leq: "≤", le: "≤", geq: "≥", ge: "≥", neq: "≠", ne: "≠", approx: "≈", equiv: "≡", sim: "∼", simeq: "≃",
    cong: "≅", propto: "∝", ll: "≪", gg: "≫", in: "∈", notin: "∉", ni: "∋", subset: "⊂", supset: "⊃",
    subseteq: "⊆", supseteq: "⊇", cup: "∪", cap: "∩", setminus: "∖", wedge: "∧", land: "∧", vee: "∨", lor: "∨",
    neg: "¬", lnot: "¬", forall: "∀", exists: "∃", to: "→", rightarrow: "→", leftarrow: "←", gets: "←",
    leftrightarrow: "↔", Rightarrow: "⇒", implies: "⟹", Leftarrow: "⇐", Leftrightarrow: "⇔", iff: "⟺",
    mapsto: "↦", mid: "∣", parallel: "∥", perp: "⊥", angle: "∠", ldots: "…", cdots: "⋯", vdots: "⋮",
    ddots: "⋱", dots: "…", prime: "′", langle: "⟨", rangle: "⟩", lfloor: "⌊", rfloor: "⌋", lceil: "⌈",
    rceil: "⌉", lbrace: "{", rbrace: "}", "{": "{", "}": "}", "|": "‖", ",": " ", ";": " ", ":": " ", "!": "",
    quad: " ", qquad: "  ", "%": "%", "$": "$", "#": "#", "&": "&", "_": "_", backslash: "\\",
  };
  const LARGE = { sum: "∑", prod: "∏", coprod: "∐", int: "∫", iint: "∬", iiint: "∭", oint: "∮", bigcup: "⋃",
                  bigcap: "⋂", lim: "lim", max: "max", min: "min", sup: "sup", inf: "inf", limsup: "lim sup",
                  liminf: "lim inf" };
  const FUNCTIONS = ["sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
                     "log", "ln", "exp", "det", "dim", "ker", "deg", "gcd", "arg", "Pr"];
  const STYLES = { mathrm: "normal", text: "text", textrm: "text", mathbf: "bold", textbf: "bold",
                   boldsymbol: "bold", mathit: "italic", textit: "italic", operatorname: "normal",
                   mathbb: "double-struck", mathcal: "script" };
  const FENCES = { "(": "(", ")": ")", "[": "[", "]": "]", "\\{": "{", "\\}": "}", "|": "|", "\\|": "‖", ".": "",
                   "\\langle": "⟨", "\\rangle": "⟩", "\\lfloor": "⌊", "\\rfloor": "⌋", "\\lceil": "⌈",
                   "\\rceil": "⌉" };

  class TooDeep extends Error {}

  function node(tag, children, text) {
    const e = document.createElementNS(NS, tag);
    if (text !== undefined) e.textContent = text;
    for (const c of children || []) e.appendChild(c);
    return e;
  }

  function row(items) {
    return items.length === 1 ? items[0] : node("mrow", items);
  }

  // Tokens: {type: "cmd", value: name} (a \command), "num", "char" (one character), "space" (read by \text only).
  function tokens(src) {
    const out = [];
    for (let i = 0; i < src.length;) {
      const c = src[i];
      if (c === "\\") {
        const m = /^\\([A-Za-z]+|.)/s.exec(src.slice(i, i + 40));
        if (!m) { out.push({ type: "char", value: "\\" }); i++; continue; }
        out.push({ type: "cmd", value: m[1] });
        i += m[0].length;
      } else if (/\s/.test(c)) {
        out.push({ type: "space", value: " " }); // kept for \text, skipped elsewhere
        i++;
      } else if (/[0-9]/.test(c)) {
        const m = /^[0-9]+(?:\.[0-9]+)?/.exec(src.slice(i, i + 400));
        out.push({ type: "num", value: m[0] });
        i += m[0].length;
      } else {
        const cp = String.fromCodePoint(src.codePointAt(i));
        out.push({ type: "char", value: cp });
        i += cp.length;
      }
    }
    return out;
  }

  // A recursive-descent parser over the tokens: formula := item*; item := atom (^ arg | _ arg)*.
  function Parser(toks) {
    let pos = 0;
    let depth = 0;
    const skip = () => { while (pos < toks.length && toks[pos].type === "space") pos++; };
    const peek = () => { skip(); return toks[pos]; };
    const next = () => { skip(); return toks[pos++]; };
    const enter = () => { if (++depth > MAX_DEPTH) throw new TooDeep(); };

    // Everything up to a closing brace, \right, or the end.
    function list(stopAtRight) {
      const items = [];
      for (let t = peek(); t; t = peek()) {
        if (t.type === "char" && t.value === "}") break;
        if (stopAtRight && t.type === "cmd" && t.value === "right") break;
        items.push(item());
      }
      return items;
    }

    function group() {
      enter();
      next(); // {
      const items = list(false);
      if (peek() && peek().value === "}") next();
      depth--;
      return row(items.length ? items : [node("mrow", [])]);
    }

    // One argument of a command or script: a {group} or a single atom.
    function arg() {
      const t = peek();
      if (!t) return node("mrow", []);
      if (t.type === "char" && t.value === "{") return group();
      return atom();
    }

    function textArg() {
      const t = peek();
      if (!t) return "";
      if (!(t.type === "char" && t.value === "{")) { next(); return t.value; }
      next();
      let text = "";
      let level = 0;
      while (pos < toks.length) {
        const u = toks[pos++]; // spaces included
        if (u.type === "char" && u.value === "{") level++;
        if (u.type === "char" && u.value === "}" && level-- === 0) break;
        text += u.type === "cmd" ? (OPERATORS[u.value] !== undefined ? OPERATORS[u.value] : "\\" + u.value + " ")
          : u.value;
      }
      return text;
    }

    function fence() {
      const t = next();
      if (!t) return "";
      const key = t.type === "cmd" ? "\\" + t.value : t.value;
      return FENCES[key] !== undefined ? FENCES[key] : key;
    }

    function atom() {
      const t = next();
      if (t.type === "num") return node("mn", [], t.value);
      if (t.type === "char") {
        if (t.value === "{") { pos--; return group(); }
        if (/\p{L}/u.test(t.value)) return node("mi", [], t.value);
        if (t.value === "'") return node("mo", [], "′");
        if (t.value === "-") return node("mo", [], "−");
        return node("mo", [], t.value);
      }
      const name = t.value;
      if (GREEK[name]) return node("mi", [], GREEK[name]);
      if (OPERATORS[name] !== undefined) return node("mo", [], OPERATORS[name]);
      if (LARGE[name]) {
        const op = node(/^[a-z]/.test(LARGE[name]) ? "mi" : "mo", [], LARGE[name]);
        op.setAttribute("data-large", "");
        return op;
      }
      if (FUNCTIONS.includes(name)) return node("mi", [], name);
      if (name === "frac" || name === "dfrac" || name === "tfrac" || name === "binom") {
        enter();
        const a = arg();
        const b = arg();
        depth--;
        if (name === "binom") {
          const f = node("mfrac", [a, b]);
          f.setAttribute("linethickness", "0");
          return node("mrow", [node("mo", [], "("), f, node("mo", [], ")")]);
        }
        return node("mfrac", [a, b]);
      }
      if (name === "sqrt") {
        enter();
        let index = null;
        if (peek() && peek().type === "char" && peek().value === "[") {
          next();
          const items = [];
          while (peek() && !(peek().type === "char" && peek().value === "]")) items.push(item());
          if (peek()) next();
          index = row(items.length ? items : [node("mrow", [])]);
        }
        const body = arg();
        depth--;
        return index ? node("mroot", [body, index]) : node("msqrt", [body]);
      }
      if (STYLES[name]) {
        const variant = STYLES[name];
        if (variant === "text") return node("mtext", [], textArg().replace(/ /g, "\u00a0")); // kept at its ends
        const text = textArg();
        const e = node("mi", [], variant === "double-struck" ? doubleStruck(text) : text);
        if (variant === "normal" || text.length > 1) e.setAttribute("mathvariant", "normal");
        if (variant === "bold") e.setAttribute("class", "bold"); // app.css: no style attribute passes the CSP
        return e;
      }
      if (name === "left") {
        enter();
        const open = fence();
        const items = list(true);
        let close = "";
        if (peek() && peek().type === "cmd" && peek().value === "right") { next(); close = fence(); }
        depth--;
        const parts = [];
        if (open) parts.push(stretchy(open));
        parts.push(...items);
        if (close) parts.push(stretchy(close));
        return node("mrow", parts);
      }
      if (name === "right") return node("mrow", []);
      if (["big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr"].includes(name)) return stretchy(fence());
      if (["displaystyle", "textstyle", "limits", "nolimits", "middle"].includes(name)) return node("mrow", []);
      if (name === "hat" || name === "bar" || name === "vec" || name === "tilde" || name === "dot" ||
          name === "overline") {
        enter();
        const base = arg();
        depth--;
        const accent = { hat: "^", bar: "¯", vec: "→", tilde: "~", dot: "˙", overline: "¯" }[name];
        const o = node("mover", [base, node("mo", [], accent)]);
        o.setAttribute("accent", "true");
        return o;
      }
      return node("mtext", [], "\\" + name); // outside the subset: shown as written
    }

    function item() {
      let base = atom();
      let sub = null;
      let sup = null;
      while (peek() && peek().type === "char" && (peek().value === "^" || peek().value === "_")) {
        const which = next().value;
        enter();
        const a = arg();
        depth--;
        if (which === "^" && !sup) sup = a;
        else if (which === "_" && !sub) sub = a;
        else base = node("mrow", [base]); // a double script: the second applies to what came before
      }
      if (!sub && !sup) return base;
      const large = base.hasAttribute && base.hasAttribute("data-large");
      if (sub && sup) return node(large ? "munderover" : "msubsup", [base, sub, sup]);
      if (sub) return node(large ? "munder" : "msub", [base, sub]);
      return node(large ? "mover" : "msup", [base, sup]);
    }

    // The whole formula; a stray closing brace is skipped.
    function parse() {
      const items = [];
      for (let t = peek(); t; t = peek()) {
        if (t.type === "char" && t.value === "}") next();
        else items.push(item());
      }
      return items;
    }

    return { parse };
  }

  function stretchy(ch) {
    const mo = node("mo", [], ch);
    mo.setAttribute("stretchy", "true");
    return mo;
  }

  function doubleStruck(text) {
    const map = { R: "ℝ", N: "ℕ", Z: "ℤ", Q: "ℚ", C: "ℂ", P: "ℙ", H: "ℍ" };
    return [...text].map((c) => map[c] || c).join("");
  }

  // A <math> element for the TeX source, or null where it is too long or too deep (the caller shows the text).
  function render(src, display) {
    if (src.length > MAX_LENGTH) return null;
    let items;
    try {
      items = Parser(tokens(src)).parse();
    } catch (e) {
      if (e instanceof TooDeep || e instanceof RangeError) return null;
      throw e;
    }
    const math = node("math", [row(items.length ? items : [node("mrow", [])])]);
    math.querySelectorAll("[data-large]").forEach((e) => e.removeAttribute("data-large"));
    if (display) math.setAttribute("display", "block");
    math.setAttribute("title", src);
    return math;
  }

  return { render };
})();
