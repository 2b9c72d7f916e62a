// Draws the matrices of the data block. Names are data: they are written with textContent
// (never innerHTML), so a hostile pod name stays text.
"use strict";
(function () {
  const page = JSON.parse(document.getElementById("data").textContent);
  const DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  const STATES = ["none"].concat(page.classes.map((c) => c.state));
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const ns = (i) => page.members[i].namespace;
  const full = (i) => page.members[i].namespace + "/" + page.members[i].pod;

  function decode(s, n) {
    const out = new Uint32Array(n);
    const w = page.width;
    let p = 0, i = 0;
    while (p < s.length) {
      let c = 0;
      for (let k = 0; k < w; k++) c = c * 62 + DIGITS.indexOf(s[p + k]);
      p += w;
      let run = 1;
      if (s[p] === "*") {
        const end = s.indexOf(";", p);
        run = parseInt(s.slice(p + 1, end), 10);
        p = end + 1;
      }
      out.fill(c, i, i + run);
      i += run;
    }
    if (i !== n) throw new Error("matrix data: " + i + " cells, expected " + n);
    return out;
  }

  const networks = [...new Set(page.matrices.map((m) => m.network))];
  const namespaces = [...new Set(page.members.map((m) => m.namespace))].sort();
  // The fragment: `all` (every matrix drawn) and `cell=M.R.T` (that cell explained), joined
  // by `&`.
  const hash = location.hash.slice(1).split("&");
  const showAll = hash.includes("all");
  const cellArg = (hash.find((h) => /^cell=\d+\.\d+\.\d+$/.test(h)) || "").slice(5);

  const netSel = $("network");
  netSel.appendChild(el("option", { value: "" }, "all"));
  for (const n of networks) netSel.appendChild(el("option", { value: n }, n));
  const nsBox = $("namespaces");
  for (const n of namespaces) {
    const l = el("label");
    const c = el("input", { type: "checkbox", value: n });
    c.checked = true;
    c.addEventListener("change", draw);
    l.appendChild(c);
    l.appendChild(document.createTextNode(" " + n + " "));
    nsBox.appendChild(l);
  }
  const matSel = $("matrix");
  function fillMatrices() {
    matSel.textContent = "";
    matSel.appendChild(el("option", { value: "all" }, "all"));
    page.matrices.forEach((m, i) => {
      if (netSel.value && m.network !== netSel.value) return;
      matSel.appendChild(el("option", { value: String(i) },
        m.port + "/" + m.protocol + " " + m.family + (netSel.value ? "" : " on " + m.network)));
    });
    matSel.value = showAll || matSel.options.length < 2 ? "all" : matSel.options[1].value;
  }
  netSel.addEventListener("change", () => { fillMatrices(); draw(); });
  matSel.addEventListener("change", draw);

  function label(i, list) {
    const m = page.members[i];
    const twice = list.filter((j) => full(j) === full(i)).length > 1;
    return m.pod + (twice ? " (" + m.interface + ")" : "");
  }

  function drawMatrix(m, wanted) {
    const cells = decode(m.cells, m.rows.length * m.cols.length);
    const rows = m.rows.map((r, i) => [r, i]).filter(([r]) => wanted.has(ns(r)));
    const cols = m.cols.map((c, j) => [c, j]).filter(([c]) => wanted.has(ns(c)));
    const wrap = el("div");
    wrap.appendChild(el("h2", {}, "network " + m.network + ", " + m.port + "/" + m.protocol +
      ", " + (m.family === "ipv4" ? "IPv4" : "IPv6")));
    if (!rows.length || !cols.length) {
      wrap.appendChild(el("p", { class: "muted" }, "no pods of the selected namespaces"));
      return wrap;
    }
    const t = el("table", { class: "matrix", "data-network": m.network, "data-port": m.port,
      "data-protocol": m.protocol, "data-family": m.family });
    const head = el("thead");
    const nsRow = el("tr");
    nsRow.appendChild(el("th", { colspan: 2 }));
    let k = 0;
    while (k < cols.length) {
      let e = k;
      while (e < cols.length && ns(cols[e][0]) === ns(cols[k][0])) e++;
      nsRow.appendChild(el("th", { class: "ns", colspan: e - k }, ns(cols[k][0])));
      k = e;
    }
    head.appendChild(nsRow);
    const colRow = el("tr");
    colRow.appendChild(el("th", { colspan: 2 }));
    const colIds = cols.map(([c]) => c);
    for (const [c] of cols) {
      const mem = page.members[c];
      colRow.appendChild(el("th", { class: "col", "data-ns": mem.namespace, "data-pod": mem.pod,
        "data-iface": mem.interface, title: full(c) + " " + mem.interface }, label(c, colIds)));
    }
    head.appendChild(colRow);
    t.appendChild(head);
    const body = el("tbody");
    const rowIds = rows.map(([r]) => r);
    rows.forEach(([r, i], n) => {
      const mem = page.members[r];
      const tr = el("tr", { "data-ns": mem.namespace, "data-pod": mem.pod, "data-iface": mem.interface });
      if (n === 0 || ns(rows[n - 1][0]) !== mem.namespace) {
        let span = 0;
        while (n + span < rows.length && ns(rows[n + span][0]) === mem.namespace) span++;
        tr.appendChild(el("th", { class: "ns", rowspan: span }, mem.namespace));
      }
      tr.appendChild(el("th", { title: full(r) + " " + mem.interface }, label(r, rowIds)));
      for (const [c, j] of cols) {
        const code = cells[i * m.cols.length + j];
        const td = document.createElement("td");
        td.className = STATES[code];
        td.dataset.c = code;
        td.dataset.r = r;
        td.dataset.t = c;
        tr.appendChild(td);
      }
      body.appendChild(tr);
    });
    t.appendChild(body);
    t.dataset.matrix = page.matrices.indexOf(m);
    wrap.appendChild(t);
    return wrap;
  }

  function draw() {
    const wanted = new Set([...nsBox.querySelectorAll("input")].filter((c) => c.checked).map((c) => c.value));
    const out = $("matrices");
    out.textContent = "";
    page.matrices.forEach((m, i) => {
      if (netSel.value && m.network !== netSel.value) return;
      if (matSel.value !== "all" && matSel.value !== String(i)) return;
      out.appendChild(drawMatrix(m, wanted));
    });
  }

  const verdict = (a) => (a ? "allowed" : "denied");
  const modeWord = (m) => (m === "monitor" ? "monitored" : "enforced");
  // An admin policy rule (its number in page.tier_rules) in `netwarden explain`'s words
  // (SPEC 8).
  const tierRule = (i) => {
    const r = page.tier_rules[i];
    return r.tier + " tier: " + r.policy + " " + r.direction + "[" + r.index + "]" +
      (r.name !== undefined ? " " + JSON.stringify(r.name) : "") + " " + r.action +
      " (priority " + r.priority + ", " + modeWord(r.mode) + ")";
  };
  // One side in one view, in the order `netwarden explain` tells it: the Admin tier, a Pass
  // on to the namespaced tier, the namespaced tier, then the Baseline tier.
  function side(lines, title, views) {
    lines.push(title);
    const one = (name, s) => {
      let t = "  " + name + ": ";
      const cont = " ".repeat(t.length);
      const decided = s.tier_rule === undefined ? undefined : page.tier_rules[s.tier_rule];
      if (decided && decided.tier === "Admin") {
        lines.push(t + tierRule(s.tier_rule) + " -> " + verdict(s.allowed));
        return;
      }
      for (const p of s.passed || []) {
        lines.push(t + tierRule(p) + " -> namespaced tier");
        t = cont;
      }
      if (!s.isolated) {
        t += decided ? "not isolated; " + tierRule(s.tier_rule) + " -> " + verdict(s.allowed)
          : "not isolated -> allowed";
      } else {
        t += "isolated by " + s.policies.join(", ");
        if (s.always) t += "; always allowed (" + s.always + ") -> allowed";
        else if (!s.rules.length) t += "; no rule allows -> denied";
        else t += "; allowed by " + s.rules.map((r) => r.kind + " " + r.policy + " " +
          r.direction + "[" + r.index + "] (" + modeWord(r.mode) + ")").join(", ");
      }
      lines.push(t);
    };
    one("enforced", views.enforced);
    if (views.staged) one("staged", views.staged);
  }
  function explain(td) {
    const m = page.matrices[+td.closest("table").dataset.matrix];
    const from = page.members[+td.dataset.r], to = page.members[+td.dataset.t];
    const lines = [full(+td.dataset.r) + " (" + from.interface + ") -> " + full(+td.dataset.t) +
      " (" + to.interface + ") " + m.port + "/" + m.protocol + " on network " + m.network + ", " + m.family];
    const code = +td.dataset.c;
    if (code === 0) { lines.push(page.kind === "diff" ? "unchanged" : "no probe"); return lines.join("\n"); }
    const c = page.classes[code - 1];
    if (c.change) {
      const ch = c.change;
      lines.push(c.state + ": enforced " + verdict(ch.before) + " -> " + verdict(ch.after) +
        ", staged " + verdict(ch.staged_before) + " -> " + verdict(ch.staged_after));
      lines.push("policies: " + (ch.policies.length ? ch.policies.join(", ") : "-"));
      if (ch.admin_policies) lines.push("admin policies: " + ch.admin_policies.join(", "));
    }
    if (c.explanation) {
      const x = c.explanation;
      lines.push("state: " + c.state + (x.cause ? " (" + x.cause + ")" : ""));
      const monitored = (x.monitored_policies || []).concat(x.monitored_admin || []);
      if (monitored.length) lines.push("monitored: " + monitored.join(", "));
      side(lines, "egress of the source", x.egress);
      side(lines, "ingress of the destination", x.ingress);
    }
    return lines.join("\n");
  }

  const tip = $("tip");
  const area = $("matrices");
  area.addEventListener("mouseover", (e) => {
    const td = e.target.closest("td");
    if (!td) { tip.style.display = "none"; return; }
    tip.textContent = explain(td);
    tip.style.display = "block";
  });
  area.addEventListener("mousemove", (e) => {
    tip.style.left = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = Math.min(e.clientY + 14, window.innerHeight - tip.offsetHeight - 4) + "px";
  });
  area.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  function select(td) {
    for (const s of area.querySelectorAll("td.sel")) s.classList.remove("sel");
    td.classList.add("sel");
    $("detail").textContent = explain(td);
  }
  area.addEventListener("click", (e) => {
    const td = e.target.closest("td");
    if (!td) return;
    select(td);
    // A link to the page now names this cell.
    const cell = "cell=" + td.closest("table").dataset.matrix + "." + td.dataset.r + "." + td.dataset.t;
    history.replaceState(null, "", "#" + (showAll ? "all&" : "") + cell);
  });

  netSel.value = "";
  fillMatrices();
  if (cellArg) {
    const [m, r, t] = cellArg.split(".");
    if (!showAll && page.matrices[+m]) matSel.value = m;
    draw();
    const td = area.querySelector('table[data-matrix="' + m + '"] td[data-r="' + r + '"][data-t="' + t + '"]');
    if (td) {
      select(td);
      td.scrollIntoView({ block: "center", inline: "center" });
    }
  } else draw();
})();
