// The approvals inbox, live: the server sends the whole inbox over server-sent events
// whenever the pending requests change (a decision at once, a new request within a second),
// and first of all on each connection. The page's slow htmx poll stays as a safety net.
(function () {
  const inbox = document.getElementById("inbox");
  window.liveStream(() => {
    const source = new EventSource("/approvals/events" + window.location.search);
    source.addEventListener("inbox", (e) => {
      inbox.innerHTML = JSON.parse(e.data).html;
      htmx.process(inbox);
    });
    return source;
  }, document.getElementById("connection"));
})();
