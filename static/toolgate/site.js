// Toolgate's few lines of JavaScript. Every page works without them; they add the reader's time
// zone and, on the reviewer queue, keyboard shortcuts and a refresh that never loses one's place.
(function () {
  "use strict";

  // The server shows times in the zone the browser reports (toolgate/timezones.py).
  try {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    // Zone names (America/Sao_Paulo, Etc/GMT+3) need no escaping in a cookie.
    if (zone && /^[A-Za-z0-9_\/+-]+$/.test(zone) && document.cookie.indexOf("tz=" + zone) === -1) {
      document.cookie = "tz=" + zone + "; path=/; max-age=31536000; SameSite=Lax";
    }
  } catch (e) {
    // An old browser without Intl: the pages stay in UTC and say so.
  }

  // On a phone the navigation's places fold behind its Menu button (site.css).
  document.documentElement.classList.add("js");
  var toggle = document.querySelector(".nav-toggle button");
  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      var nav = toggle.closest("nav");
      var open = nav.classList.toggle("open");
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  // A card opened from the list's Reject: its reason, ready to type.
  var opened = document.querySelector("#queue details.reject[open] textarea");
  if (opened) opened.focus();

  function items() {
    return Array.prototype.slice.call(document.querySelectorAll("#queue .item"));
  }

  function selected() {
    return document.querySelector("#queue .item.selected");
  }

  function select(item) {
    items().forEach(function (other) {
      other.classList.toggle("selected", other === item);
      other.setAttribute("aria-current", other === item ? "true" : "false");
    });
    if (item) {
      item.focus({ preventScroll: true });
      item.scrollIntoView({ block: "nearest" });
    }
  }

  function move(step) {
    var all = items();
    if (!all.length) return;
    var index = all.indexOf(selected());
    var next = index === -1 ? (step > 0 ? 0 : all.length - 1) : index + step;
    select(all[Math.max(0, Math.min(all.length - 1, next))]);
  }

  function openReject(item) {
    var details = item.querySelector("details.reject");
    if (!details) {
      // A row of the list: its card, opened with the reason to write.
      var reject = item.querySelector("a.reject-link") || item.querySelector("a.open");
      if (reject) reject.click();
      return;
    }
    details.open = true;
    var reason = details.querySelector("textarea");
    if (reason) reason.focus();
  }

  function typing(target) {
    return (
      target &&
      (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName))
    );
  }

  function toggleHelp() {
    var help = document.getElementById("keys-help");
    if (!help) return;
    if (help.open) help.close();
    else help.showModal();
  }

  // An approval above the policy's second-look amount asks once more, in the page, before its
  // POST: the dialog shows the amount and the customer's sum, and its own form sends the
  // confirmation. (Without JavaScript the server answers the first POST with the same dialog.)
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form || !form.dataset || !form.dataset.secondLook) return;
    var dialog = document.getElementById(form.dataset.secondLook);
    if (!dialog) return;
    event.preventDefault();
    var separate = form.querySelector("input[name=separate]");
    var carried = dialog.querySelector("input[name=separate]");
    if (carried) carried.value = separate ? separate.value : "";
    if (!dialog.open) dialog.showModal();
    var confirm = dialog.querySelector("button.confirm");
    if (confirm) confirm.focus();
  }, true);

  // Whether the queue may reload now: never while the reader is writing a reason, reading help
  // or looking once more at an approval.
  window.toolgateQueueMayRefresh = function () {
    var help = document.getElementById("keys-help");
    if (help && help.open) return false;
    if (document.querySelector("#queue dialog[open]")) return false;
    if (document.querySelector("#queue details.reject[open]")) return false;
    if (document.querySelector("#queue details.edit[open]")) return false;
    return !typing(document.activeElement);
  };

  document.addEventListener("keydown", function (event) {
    if (!document.getElementById("queue")) return;
    if (event.target && event.target.tagName === "TEXTAREA" && event.key === "Enter" &&
        !event.shiftKey) {
      // A reason is a line or two: Enter sends it, Shift+Enter starts a new line.
      var form = event.target.form;
      if (form && event.target.value.trim()) {
        event.preventDefault();
        form.requestSubmit();
      }
      return;
    }
    if (event.key === "Escape") {
      var open = document.querySelector("#queue details.reject[open]");
      if (open) {
        open.open = false;
        var owner = open.closest(".item");
        if (owner) select(owner);
      }
      return;
    }
    if (typing(event.target) || event.ctrlKey || event.metaKey || event.altKey) return;
    // A second look is open: its own buttons (and Esc) decide.
    if (document.querySelector("#queue dialog.second-look[open]")) return;
    var item = selected();
    switch (event.key) {
      case "j":
        move(1);
        break;
      case "k":
        move(-1);
        break;
      case "a":
        if (!item) return;
        var approve = item.querySelector("form.approve button");
        if (approve) approve.click();
        else {
          // A row whose approval asks more than a click: its card.
          var open = item.querySelector("a.open");
          if (open) open.click();
        }
        break;
      case "r":
        if (!item) return;
        openReject(item);
        break;
      case "o":
      case "Enter":
        if (!item || event.target !== item) return;
        var link = item.querySelector("a.detail-link");
        if (link) link.click();
        break;
      case "?":
        toggleHelp();
        break;
      default:
        return;
    }
    event.preventDefault();
  });

  document.addEventListener("click", function (event) {
    var item = event.target.closest && event.target.closest("#queue .item");
    if (!item) return;
    // Choosing a row of the list opens its card (its links and buttons do what they say).
    if (item.tagName === "TR" && !event.target.closest("a, button, form, input")) {
      var card = item.querySelector("a.detail-link");
      if (card) {
        card.click();
        return;
      }
    }
    if (!item.classList.contains("selected")) select(item);
  });

  // After the queue reloads, the same item stays selected if it is still there.
  var keep = null;
  document.addEventListener("htmx:beforeSwap", function () {
    var item = selected();
    keep = item ? item.id : null;
  });
  document.addEventListener("htmx:afterSwap", function () {
    // The tab's title counts what the badge counts: every pending item, not only those shown.
    var queue = document.getElementById("queue");
    if (queue && queue.dataset.pendingTotal !== undefined) {
      var total = parseInt(queue.dataset.pendingTotal, 10) || 0;
      document.title = document.title.replace(/^Approvals( \(\d+\))?/,
        "Approvals" + (total ? " (" + total + ")" : ""));
    }
    if (!keep) return;
    var again = document.getElementById(keep);
    if (again) {
      again.classList.add("selected");
      again.setAttribute("aria-current", "true");
      if (document.activeElement === document.body) again.focus({ preventScroll: true });
    }
    keep = null;
  });
})();
