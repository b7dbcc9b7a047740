// Refreshes the parts of a page marked data-refresh="<url>" every data-every seconds (default 5).
// With data-while="<selector>", only while the part holds something that matches it (a run still
// "running"): it stops once the fragment shows none.  The server renders the fragment (escaped
// HTML); a fragment refused (logged out) stops the refresh.
(function () {
  "use strict";
  function refresh(el) {
    var every = (parseInt(el.getAttribute("data-every"), 10) || 5) * 1000;
    var needed = el.getAttribute("data-while");
    function wanted() { return !needed || el.querySelector(needed) !== null; }
    if (!wanted()) {
      return;
    }
    var timer = window.setInterval(function () {
      fetch(el.getAttribute("data-refresh"), {credentials: "same-origin", headers: {"Accept": "text/html"}})
        .then(function (response) {
          if (!response.ok) {
            window.clearInterval(timer);
            el.setAttribute("data-stale", "true");
            return null;
          }
          return response.text();
        })
        .then(function (html) {
          if (html !== null) {
            el.innerHTML = html;
            el.removeAttribute("data-stale");
            if (!wanted()) {
              window.clearInterval(timer);
            }
          }
        })
        .catch(function () { el.setAttribute("data-stale", "true"); });
    }, every);
  }
  document.querySelectorAll("[data-refresh]").forEach(refresh);
})();

// A form marked data-confirm="<question>" (turning a budget off, resetting what it spent) asks first;
// Cancel sends nothing.
(function () {
  "use strict";
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) {
        event.preventDefault();
      }
    });
  });
})();
