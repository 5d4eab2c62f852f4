// A live page's event stream: `open()` makes the EventSource (and adds its listeners); the
// status element says live, reconnecting or paused. A hidden tab lets go of its stream and
// opens a new one when shown again: a browser keeps at most 6 connections per host.
window.liveStream = function (open, status) {
  let source = null;
  let ended = false;

  function connect() {
    source = open();
    source.addEventListener("open", () => { status.textContent = "live"; status.className = "ok"; });
    source.addEventListener("error", () => {
      if (!ended) { status.textContent = "reconnecting…"; status.className = "warn"; }
    });
  }

  document.addEventListener("visibilitychange", () => {
    if (ended) return;
    if (document.hidden && source) {
      source.close();
      source = null;
      status.textContent = "paused while hidden";
      status.className = "warn";
    } else if (!document.hidden && !source) {
      connect();
    }
  });
  connect();
  return {
    end() {
      ended = true;
      if (source) source.close();
    },
  };
};
