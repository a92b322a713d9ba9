// The attention page: translate one sentence through POST /v1/translate and draw the
// decoder's cross-attention as an SVG heatmap (target tokens x source tokens), one layer
// at a time, for one head or averaged over heads. Plain JS, no dependencies.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG_NS = "http://www.w3.org/2000/svg";
  const AVERAGE = "avg";
  // Where the API key lives (aiayn serve --api-key): this tab only, gone when it closes.
  const KEY_STORAGE = "aiayn-api-key";
  let attention = null; // {src_tokens, tgt_tokens, layers, heads, weights[L][H][T][S]}

  // Viridis (matplotlib's default map) sampled at 9 points; linear in between. The same
  // map as the PNGs of `aiayn plot attention`, so the page and the plots read alike.
  const VIRIDIS = [
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
  ];

  function color(v) {
    const x = Math.min(1, Math.max(0, v)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
    const f = x - i;
    const c = VIRIDIS[i].map((a, k) => Math.round(a + f * (VIRIDIS[i + 1][k] - a)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  // fetch() with the API key, if one was given; a 401 shows the key form.
  async function api(path, options) {
    const key = sessionStorage.getItem(KEY_STORAGE);
    const headers = Object.assign({}, (options || {}).headers);
    if (key) headers.Authorization = `Bearer ${key}`;
    const res = await fetch(path, Object.assign({}, options, { headers }));
    if (res.status === 401) {
      $("auth-message").textContent = key
        ? "The server refused this API key: enter the right one."
        : "This server needs an API key (aiayn serve --api-key).";
      $("auth-panel").hidden = false;
      $("api-key").focus();
    }
    return res;
  }

  function useKey(event) {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY_STORAGE, key);
    $("api-key").value = "";
    $("auth-panel").hidden = true;
    showError("");
    loadModelInfo();
  }

  async function loadModelInfo() {
    try {
      const res = await api("/v1/model");
      const info = await res.json();
      if (!res.ok) throw new Error(info.message || `HTTP ${res.status}`);
      const langs = info.languages || {};
      $("src-lang").textContent = langs.source ? `(${langs.source})` : "";
      $("tgt-lang").textContent = langs.target ? `(${langs.target})` : "";
      const parts = [];
      if (langs.source) parts.push(`${langs.source} → ${langs.target}`);
      if (info.parameters) parts.push(`${info.parameters.parameters.toLocaleString()} parameters`);
      if (info.vocabulary) {
        const v = info.vocabulary;
        parts.push(v.joint ? `joint vocabulary ${v.source}` : `vocabularies ${v.source} / ${v.target}`);
      }
      const m = (info.config || {}).model;
      if (m) parts.push(`${m.n_encoder_layers}+${m.n_decoder_layers} layers, ${m.n_heads} heads, d_model ${m.d_model}`);
      const d = (info.config || {}).decode;
      if (d) $("beam").value = d.beam;
      $("model-info").textContent = parts.join(" · ");
    } catch (err) {
      $("model-info").textContent = "model information unavailable";
    }
  }

  async function translate() {
    const text = $("source").value.trim();
    if (!text) { showError("Type a sentence first."); return; }
    showError("");
    const button = $("translate");
    button.disabled = true;
    $("status").textContent = "translating…";
    const started = performance.now();
    try {
      const body = { texts: [text], attention: true };
      const beam = parseInt($("beam").value, 10);
      if (Number.isInteger(beam) && beam > 0) body.beam = beam;
      const res = await api("/v1/translate", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      const data = await res.json();
      if (!res.ok) throw new Error(data.message || `HTTP ${res.status}`);
      $("translation").textContent = data.translations[0];
      $("score").textContent = `score ${data.scores[0].toFixed(3)} · ${Math.round(performance.now() - started)} ms`;
      $("status").textContent = "";
      setAttention(data.attention ? data.attention[0] : null);
    } catch (err) {
      $("status").textContent = "";
      showError(`Translation failed: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  }

  function setAttention(att) {
    attention = att && att.layers > 0 ? att : null;
    $("attention-panel").hidden = !attention;
    if (!attention) return;
    const layer = $("layer");
    const head = $("head");
    const keepLayer = layer.value;
    const keepHead = head.value;
    layer.replaceChildren();
    for (let l = 0; l < attention.layers; l++) layer.add(new Option(`${l + 1} of ${attention.layers}`, String(l)));
    head.replaceChildren(new Option("average over heads", AVERAGE));
    for (let h = 0; h < attention.heads; h++) head.add(new Option(`head ${h + 1}`, String(h)));
    // The last layer by default: its alignments are usually the sharpest.
    layer.value = keepLayer && Number(keepLayer) < attention.layers ? keepLayer : String(attention.layers - 1);
    head.value = keepHead && (keepHead === AVERAGE || Number(keepHead) < attention.heads) ? keepHead : AVERAGE;
    render();
  }

  function matrix() {
    const l = Number($("layer").value);
    const h = $("head").value;
    const heads = attention.weights[l];
    if (h !== AVERAGE) return heads[Number(h)];
    const T = heads[0].length;
    const S = T ? heads[0][0].length : 0;
    const out = Array.from({ length: T }, () => new Array(S).fill(0));
    for (const w of heads) for (let t = 0; t < T; t++) for (let s = 0; s < S; s++) out[t][s] += w[t][s] / heads.length;
    return out;
  }

  function render() {
    const box = $("heatmap");
    box.replaceChildren();
    if (!attention) return;
    const w = matrix();
    const src = attention.src_tokens;
    const tgt = attention.tgt_tokens;
    const T = w.length;
    const S = T ? w[0].length : 0;
    const cell = Math.max(14, Math.min(36, Math.floor(760 / Math.max(S, 1))));
    const longest = (tokens) => tokens.reduce((m, t) => Math.max(m, t.length), 1);
    const left = 16 + 7.5 * Math.min(24, longest(tgt));
    const top = 16 + 7.5 * Math.min(24, longest(src));
    const legend = 60;
    const width = left + S * cell + legend;
    const height = top + T * cell + 10;
    const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": `cross-attention, ${T} target by ${S} source tokens` });

    const srcLabels = src.map((tok, s) => {
      const x = left + s * cell + cell / 2;
      const label = el("text", { x, y: top - 6, transform: `rotate(-60 ${x} ${top - 6})`, class: "src-token" }, tok);
      svg.appendChild(label);
      return label;
    });
    const tgtLabels = tgt.map((tok, t) => {
      const label = el("text", { x: left - 6, y: top + t * cell + cell / 2 + 4, "text-anchor": "end",
        class: "tgt-token" }, tok);
      svg.appendChild(label);
      return label;
    });

    let vmax = 0;
    for (const row of w) for (const v of row) vmax = Math.max(vmax, v);
    vmax = vmax > 0 ? vmax : 1;
    const info = $("cell-info");
    for (let t = 0; t < T; t++) {
      for (let s = 0; s < S; s++) {
        const v = w[t][s];
        const rect = el("rect", { x: left + s * cell, y: top + t * cell, width: cell, height: cell,
          fill: color(v / vmax), class: "cell", "data-t": t, "data-s": s, "data-w": v.toFixed(4) });
        rect.appendChild(el("title", {}, `${tgt[t]} ← ${src[s]}: ${v.toFixed(3)}`));
        rect.addEventListener("mouseenter", () => {
          info.textContent = `${tgt[t]} ← ${src[s]}: ${v.toFixed(3)}`;
          srcLabels[s].classList.add("active");
          tgtLabels[t].classList.add("active");
        });
        rect.addEventListener("mouseleave", () => {
          srcLabels[s].classList.remove("active");
          tgtLabels[t].classList.remove("active");
        });
        svg.appendChild(rect);
      }
    }

    // Colour bar: 0 .. max weight of the matrix shown.
    const barX = left + S * cell + 16;
    const barH = Math.max(T * cell, 40);
    const steps = 32;
    for (let i = 0; i < steps; i++) {
      svg.appendChild(el("rect", { x: barX, y: top + (barH * i) / steps, width: 10, height: barH / steps + 0.5,
        fill: color(1 - i / (steps - 1)), class: "legend" }));
    }
    svg.appendChild(el("text", { x: barX + 14, y: top + 10 }, vmax.toFixed(2)));
    svg.appendChild(el("text", { x: barX + 14, y: top + barH }, "0"));
    box.appendChild(svg);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("translate").addEventListener("click", translate);
    $("auth-form").addEventListener("submit", useKey);
    $("source").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate();
    });
    $("layer").addEventListener("change", render);
    $("head").addEventListener("change", render);
    loadModelInfo();
  });
})();
