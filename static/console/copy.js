// Copy buttons: a <button class="copy" data-copy="ID"> copies the text of the element with that id and says so.
(function () {
  "use strict";
  for (const button of document.querySelectorAll("button.copy[data-copy]")) {
    button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.copy).textContent;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch (err) {
        // Without clipboard access (an insecure origin), select the text so Ctrl-C copies it.
        const range = document.createRange();
        range.selectNodeContents(document.getElementById(button.dataset.copy));
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        button.textContent = "Selected: press Ctrl-C";
      }
      setTimeout(() => { button.textContent = "Copy"; }, 2500);
    });
  }
})();
