// The session page: events arrive over server-sent events (the SSE id is the stream id, so
// the browser's automatic reconnect resumes after the last one with Last-Event-ID; a stream
// opened again after the tab was hidden resumes after the last id with `?after=`).
// Streamed chunks show in a live block until their complete event replaces it; a
// subagent's events go under the call that spawned it.
(function () {
  const events = document.getElementById("events");
  const status = document.getElementById("connection");
  const session = events.dataset.session;
  let last = "";

  function container(data) {
    const parent = data.parent && document.getElementById("children-" + data.parent);
    return parent || events;
  }

  function add(html, where) {
    const template = document.createElement("template");
    template.innerHTML = html;
    const node = template.content.firstElementChild;
    where.appendChild(node);
    htmx.process(node);
    return node;
  }

  function seen(e) {
    if (e.lastEventId) last = e.lastEventId;
  }

  function open() {
    const after = last ? "?after=" + encodeURIComponent(last) : "";
    const source = new EventSource("/sessions/" + encodeURIComponent(session) + "/events" + after);
    source.addEventListener("trimmed", (e) => {
      seen(e);
      add('<div class="warn"></div>', events).textContent = JSON.parse(e.data).message;
    });
    source.addEventListener("chunk", (e) => {
      seen(e);
      const data = JSON.parse(e.data);
      let live = document.getElementById("live-" + data.key);
      if (!live) {
        live = add('<pre class="live ' + data.kind + '"></pre>', container(data));
        live.id = "live-" + data.key;
      }
      live.textContent += data.text;
    });
    source.addEventListener("event", (e) => {
      seen(e);
      const data = JSON.parse(e.data);
      const live = document.getElementById("live-" + data.key);
      if (live) live.remove();
      add(data.html, container(data));
      if (data.type === "ApprovalDecision" && data.request) {
        const buttons = document.getElementById("decide-" + data.request);
        if (buttons) buttons.remove();  // decided: the decision's line says by whom
      }
    });
    return source;
  }

  window.liveStream(open, status);
})();
