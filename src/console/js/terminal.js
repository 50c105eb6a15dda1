// A minimal terminal: enough of a VT100 for a shell and line editing (text, CR/LF, backspace,
// tabs, cursor moves, erase in line and display, autowrap); colours and other attributes are
// dropped, as are titles and modes. Screen is the model (pure: tests/compat/
// console_terminal.test.mjs); Terminal draws it into a <pre> and turns keys into the bytes a
// terminal sends.

const MAX_LINES = 5000;

export class Screen {
  constructor(cols = 100, rows = 30) {
    this.cols = cols;
    this.rows = rows;
    this.lines = [[]];
    this.row = 0;
    this.col = 0;
    this.state = "text";
    this.params = "";
    this.decoder = new TextDecoder();
  }

  /** Bytes (Uint8Array, UTF-8 split anywhere) or text from the shell. */
  write(data) {
    const text = typeof data === "string" ? data : this.decoder.decode(data, { stream: true });
    for (const ch of text) this.feed(ch);
  }

  /** The text on screen, lines joined with "\n", trailing blanks dropped. */
  text() {
    return this.lines.map((l) => l.join("").trimEnd()).join("\n");
  }

  line() {
    while (this.lines.length <= this.row) this.lines.push([]);
    return this.lines[this.row];
  }

  top() {
    return Math.max(0, this.lines.length - this.rows);
  }

  newline() {
    this.row++;
    this.line();
    if (this.lines.length > MAX_LINES) {
      const drop = this.lines.length - MAX_LINES;
      this.lines.splice(0, drop);
      this.row -= drop;
    }
  }

  put(ch) {
    if (this.col >= this.cols) { // autowrap
      this.newline();
      this.col = 0;
    }
    const l = this.line();
    while (l.length < this.col) l.push(" ");
    l[this.col++] = ch;
  }

  feed(ch) {
    switch (this.state) {
      case "esc":
        if (ch === "[") { this.state = "csi"; this.params = ""; }
        else if (ch === "]") this.state = "osc";
        else if (ch === "(" || ch === ")") this.state = "charset";
        else this.state = "text"; // ESC =, ESC >, ESC 7/8...: ignored
        return;
      case "charset":
        this.state = "text";
        return;
      case "osc": // a title: up to BEL or ESC \
        if (ch === "\x07") this.state = "text";
        else if (ch === "\x1b") this.state = "osc-esc";
        return;
      case "osc-esc":
        this.state = ch === "\\" ? "text" : "osc";
        return;
      case "csi":
        if (ch >= "@" && ch <= "~") {
          this.state = "text";
          this.csi(ch, this.params);
        } else {
          this.params += ch;
        }
        return;
      default:
        break;
    }
    switch (ch) {
      case "\x1b": this.state = "esc"; return;
      case "\r": this.col = 0; return;
      case "\n": this.newline(); return;
      case "\b": this.col = Math.max(0, Math.min(this.col, this.cols) - 1); return;
      case "\t": this.col = Math.min(this.cols - 1, (Math.floor(this.col / 8) + 1) * 8); return;
      default:
        if (ch < " " || ch === "\x7f") return; // BEL and other controls
        this.put(ch);
    }
  }

  csi(final, params) {
    if (params.startsWith("?") || params.startsWith(">")) return; // private modes
    const args = params.split(";").map((p) => parseInt(p, 10));
    const n = Number.isFinite(args[0]) && args[0] > 0 ? args[0] : 1;
    const l = this.line();
    switch (final) {
      case "m": return; // colours and attributes: dropped
      case "A": this.row = Math.max(this.top(), this.row - n); return;
      case "B": this.row += n; this.line(); return;
      case "C": this.col = Math.min(this.cols - 1, this.col + n); return;
      case "D": this.col = Math.max(0, this.col - n); return;
      case "G": this.col = Math.min(this.cols - 1, n - 1); return;
      case "H":
      case "f": {
        const c = Number.isFinite(args[1]) && args[1] > 0 ? args[1] : 1;
        this.row = this.top() + n - 1;
        this.line();
        this.col = Math.min(this.cols - 1, c - 1);
        return;
      }
      case "K": {
        const mode = args[0] || 0;
        if (mode === 0) l.length = Math.min(l.length, this.col);
        else if (mode === 1) for (let i = 0; i <= this.col && i < l.length; i++) l[i] = " ";
        else l.length = 0;
        return;
      }
      case "J": {
        const mode = args[0] || 0;
        if (mode >= 2) {
          this.lines = [[]];
          this.row = 0;
          this.col = 0;
        } else if (mode === 0) {
          l.length = Math.min(l.length, this.col);
          this.lines.length = this.row + 1;
        }
        return;
      }
      case "P": l.splice(this.col, n); return;
      case "@": if (this.col < l.length) l.splice(this.col, 0, ...Array(n).fill(" ")); return;
      case "X": for (let i = this.col; i < this.col + n && i < l.length; i++) l[i] = " "; return;
      default: return; // everything else is ignored
    }
  }
}

export class Terminal {
  constructor(el, { cols = 100, rows = 30, onData = () => {} } = {}) {
    this.el = el;
    this.screen = new Screen(cols, rows);
    this.onData = onData;
    this.pending = false;
    el.tabIndex = 0;
    el.classList.add("terminal");
    el.addEventListener("keydown", (e) => this.key(e));
    el.addEventListener("paste", (e) => {
      e.preventDefault();
      this.onData(e.clipboardData.getData("text").replace(/\r?\n/g, "\r"));
    });
    this.render();
  }

  write(data) {
    this.screen.write(data);
    this.schedule();
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  render() {
    const { lines, row, col } = this.screen;
    const cur = lines[row] ?? [];
    const before = lines.slice(0, row).map((l) => l.join("")).join("\n");
    const head = cur.slice(0, col).join("").padEnd(col, " ");
    const under = cur[col] ?? " ";
    const tail = cur.slice(col + 1).join("");
    const after = lines.slice(row + 1).map((l) => l.join("")).join("\n");
    const cursor = document.createElement("span");
    cursor.className = "cursor";
    cursor.textContent = under;
    this.el.replaceChildren((row > 0 ? before + "\n" : "") + head, cursor,
      tail + (row + 1 < lines.length ? "\n" + after : ""));
    this.el.scrollTop = this.el.scrollHeight;
  }

  key(e) {
    const seq = keySequence(e);
    if (seq === null) return;
    e.preventDefault();
    this.onData(seq);
  }
}

const KEYS = {
  Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", ArrowUp: "\x1b[A",
  ArrowDown: "\x1b[B", ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D", Home: "\x1b[H", End: "\x1b[F",
  Delete: "\x1b[3~", PageUp: "\x1b[5~", PageDown: "\x1b[6~",
};

/** The bytes a key stands for, or null for one the terminal leaves to the browser. */
export function keySequence(e) {
  // Ctrl-Shift-C/V (and the Meta key) stay the browser's: copy and paste, as in terminals.
  if (e.metaKey || (e.ctrlKey && e.shiftKey)) return null;
  if (e.ctrlKey && !e.altKey && e.key.length === 1) {
    const c = e.key.toUpperCase().charCodeAt(0);
    if (c >= 64 && c <= 95) return String.fromCharCode(c - 64); // Ctrl-A..Ctrl-_
    return null;
  }
  if (KEYS[e.key]) return KEYS[e.key];
  if (e.key.length === 1) return e.altKey ? `\x1b${e.key}` : e.key;
  return null;
}
