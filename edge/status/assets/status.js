// Refreshes the status page from api/v1/status every few seconds. The page
// is complete without it: the server rendered every value already. The
// formats here match the Go template functions in page.go.
"use strict";
(function () {
  var every = 2000;

  function num(n) { return Math.round(n).toLocaleString("en-US"); }
  function bytes(n) {
    if (n < 0) return "off";
    var u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"], i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return i === 0 ? n + " B" : n.toFixed(1) + " " + u[i];
  }
  function dur(s) {
    s = Math.floor(s);
    function two(a, ua, b, ub) { return b === 0 ? a + ua : a + ua + " " + b + ub; }
    var m = Math.floor(s / 60), h = Math.floor(s / 3600);
    if (s < 60) return s + "s";
    if (m < 60) return two(m, "m", s % 60, "s");
    if (h < 24) return two(h, "h", m % 60, "m");
    return two(Math.floor(h / 24), "d", h % 24, "h");
  }
  function rate(r) { return r.toFixed(1) + "/s"; }
  function clock(t) { return t.substring(11, 19) + " UTC"; }
  function maxlag(groups) {
    var m = 0;
    (groups || []).forEach(function (g) { if (g.lag_records > m) m = g.lag_records; });
    return num(m);
  }
  var formats = { num: num, bytes: bytes, dur: dur, rate: rate, time: clock, maxlag: maxlag };

  function get(doc, path) {
    return path.split(".").reduce(function (v, k) { return v == null ? v : v[k]; }, doc);
  }
  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }
  function opt(v, f) { return v == null ? "\u2013" : f(v); }
  function retention(r) {
    var parts = [];
    if (r.max_age_seconds > 0) parts.push(dur(r.max_age_seconds));
    if (r.max_bytes > 0) parts.push(bytes(r.max_bytes));
    return parts.length ? parts.join(", ") : "unlimited";
  }

  function streams(doc) {
    var body = document.querySelector("#streams tbody");
    body.textContent = "";
    doc.streams.forEach(function (s) {
      var tr = document.createElement("tr");
      tr.dataset.stream = s.name;
      cell(tr, s.name);
      cell(tr, s.filters.join(" "));
      cell(tr, num(s.first_offset), "n");
      cell(tr, num(s.next_offset), "n").dataset.field = "next_offset";
      cell(tr, num(s.records), "n");
      cell(tr, bytes(s.bytes), "n");
      cell(tr, opt(s.oldest_record_age_seconds, dur), "n");
      cell(tr, retention(s.retention));
      body.appendChild(tr);
    });
  }

  function groups(doc) {
    var body = document.querySelector("#groups tbody");
    body.textContent = "";
    if (!doc.groups.length) {
      var tr = document.createElement("tr");
      tr.className = "empty";
      cell(tr, "No consumer groups.").colSpan = 6;
      body.appendChild(tr);
      return;
    }
    doc.groups.forEach(function (g) {
      var tr = document.createElement("tr");
      tr.dataset.group = g.group;
      tr.dataset.stream = g.stream;
      cell(tr, g.group);
      cell(tr, g.stream);
      cell(tr, opt(g.committed_offset, num), "n");
      cell(tr, opt(g.lag_records, num), "n").dataset.field = "lag_records";
      cell(tr, opt(g.lag_seconds, dur), "n");
      if (g.consumer) cell(tr, g.consumer);
      else cell(tr, "").appendChild(document.createElement("i")).textContent = "none";
      body.appendChild(tr);
    });
  }

  function sinks(doc) {
    var body = document.querySelector("#sinks tbody");
    body.textContent = "";
    if (!doc.sinks.length) {
      var tr = document.createElement("tr");
      tr.className = "empty";
      cell(tr, "No sinks.").colSpan = 7;
      body.appendChild(tr);
      return;
    }
    doc.sinks.forEach(function (s) {
      var tr = document.createElement("tr");
      tr.dataset.sink = s.name;
      cell(tr, s.name);
      cell(tr, s.kind);
      cell(tr, s.upstream);
      var st = cell(tr, s.state, "state " + s.state);
      st.dataset.field = "state";
      cell(tr, num(s.lag_records), "n").dataset.field = "lag_records";
      cell(tr, dur(s.lag_seconds), "n");
      cell(tr, s.last_error || "");
      body.appendChild(tr);
    });
  }

  function sources(doc) {
    var body = document.querySelector("#sources tbody");
    body.textContent = "";
    var list = doc.sources || [];
    if (!list.length) {
      var tr = document.createElement("tr");
      tr.className = "empty";
      cell(tr, "No sources.").colSpan = 8;
      body.appendChild(tr);
      return;
    }
    list.forEach(function (s) {
      var tr = document.createElement("tr");
      tr.dataset.source = s.name;
      cell(tr, s.name);
      cell(tr, s.kind);
      cell(tr, s.upstream);
      cell(tr, s.stream);
      var st = cell(tr, s.state, "state " + s.state);
      st.dataset.field = "state";
      cell(tr, num(s.received), "n").dataset.field = "received";
      cell(tr, s.last_received_seconds == null ? "never" : dur(s.last_received_seconds) + " ago", "n");
      cell(tr, s.last_error || "");
      body.appendChild(tr);
    });
  }

  // site rebuilds the site section's tables; the section exists only on
  // a site node (the page is rendered with it).
  function site(doc) {
    var c = doc.cluster;
    if (!c || !document.getElementById("site")) return;
    document.getElementById("controller").textContent = c.controller || "none";
    var members = document.querySelector("#members tbody");
    members.textContent = "";
    c.members.forEach(function (m) {
      var tr = document.createElement("tr");
      tr.dataset.member = m.id;
      cell(tr, m.id);
      // A decommission's progress: draining (with the streams it still
      // holds), drained (stop it), removed.
      var removal = m.removal ? " (" + m.removal + (m.holds ? ": " + m.holds.join(", ") : "") + ")" : "";
      cell(tr, m.state + removal, "state " + m.state).dataset.field = "state";
      cell(tr, m.role);
      cell(tr, m.mqtt_addr || "");
      cell(tr, m.version || "");
      members.appendChild(tr);
    });
    var repl = document.querySelector("#replication tbody");
    repl.textContent = "";
    c.streams.forEach(function (s) {
      var tr = document.createElement("tr");
      tr.dataset.stream = s.name;
      if (s.under_replicated) tr.className = "warning";
      cell(tr, s.name);
      cell(tr, s.leader || "offline").dataset.field = "leader";
      cell(tr, s.replicas.join(" "));
      cell(tr, s.isr.join(" ")).dataset.field = "isr";
      cell(tr, num(s.high_watermark), "n");
      repl.appendChild(tr);
    });
  }

  function alarms(doc) {
    var sec = document.getElementById("alarms");
    sec.textContent = "";
    if (!doc.alarms.length) {
      var ok = document.createElement("p");
      ok.className = "ok";
      ok.textContent = "No alarms.";
      sec.appendChild(ok);
      return;
    }
    doc.alarms.forEach(function (a) {
      var p = document.createElement("p");
      p.className = "alarm " + a.severity;
      p.dataset.alarm = a.id;
      p.appendChild(document.createElement("b")).textContent = a.severity;
      p.appendChild(document.createTextNode(" " + a.message));
      sec.appendChild(p);
    });
  }

  // points matches sparkPoints in page.go: 120 x 32, the top at the largest value.
  function points(vals) {
    if (!vals.length) return "";
    var top = Math.max.apply(null, vals.concat([1])), step = vals.length > 1 ? 120 / (vals.length - 1) : 0;
    return vals.map(function (v, i) {
      return (i * step).toFixed(1) + "," + (31 - 30 * v / top).toFixed(1);
    }).join(" ");
  }
  var series = { published: "published_per_second", delivered: "delivered_per_second", lag: "max_group_lag_records" };

  function render(doc) {
    document.querySelectorAll("[data-k]").forEach(function (el) {
      var v = get(doc, el.dataset.k);
      if (v === undefined) return;
      if (el.dataset.k === "disk.free_bytes" && !doc.disk.known) { el.textContent = "unknown"; return; }
      var f = formats[el.dataset.f];
      el.textContent = f ? f(v) : String(v);
    });
    document.querySelectorAll("svg[data-spark]").forEach(function (svg) {
      var vals = doc.history[series[svg.dataset.spark]] || [];
      svg.querySelector("polyline").setAttribute("points", points(vals));
    });
    alarms(doc);
    streams(doc);
    groups(doc);
    sinks(doc);
    sources(doc);
    site(doc);
    document.body.classList.remove("stale");
  }

  function refresh() {
    fetch("api/v1/status", { cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(render)
      .catch(function () { document.body.classList.add("stale"); })
      .finally(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
