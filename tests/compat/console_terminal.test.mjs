// The web console's terminal model (src/console/js/terminal.js, Screen): what a shell's output
// leaves on screen, table-driven, and the same however the bytes are split into writes (a
// WebSocket frame may end inside a UTF-8 character or an escape sequence). Plus the bytes keys
// are sent as. No browser needed: the model is plain JavaScript.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Screen, keySequence } from "../../src/console/js/terminal.js";

const CASES = [
  // [name, output, screen text, [row, col] of the cursor]
  ["plain lines", "a\r\nb\r\n", "a\nb\n", [2, 0]],
  ["a bare LF keeps the column", "ab\ncd", "ab\n  cd", [1, 4]],
  ["CR rewrites the line", "hello\rJ", "Jello", [0, 1]],
  ["backspace moves back, the next character replaces", "ab\bc", "ac", [0, 2]],
  ["backspace at the start stays", "\b\bx", "x", [0, 1]],
  ["readline's erase: BS, space, BS", "abc\b \b", "ab", [0, 2]],
  ["colours are dropped", "\x1b[1;31mred\x1b[0m \x1b[38;5;208mok\x1b[m", "red ok", [0, 6]],
  ["erase to the end of the line", "abcdef\r\x1b[2C\x1b[K", "ab", [0, 2]],
  ["erase the whole line", "abc\x1b[2K", "", [0, 3]],
  ["erase from the start of the line", "abcdef\x1b[3D\x1b[1K", "    ef", [0, 3]],
  ["clear the screen", "a\r\nb\x1b[2J\x1b[Hz", "z", [0, 1]],
  ["cursor position, 1-based", "\x1b[1;5Hx", "    x", [0, 5]],
  ["cursor column", "abcdef\x1b[3Gx", "abxdef", [0, 3]],
  ["delete characters", "abcdef\r\x1b[C\x1b[2P", "adef", [0, 1]],
  ["insert blanks", "abc\r\x1b[C\x1b[2@", "a  bc", [0, 1]],
  ["erase characters", "abcdef\r\x1b[C\x1b[2X", "a  def", [0, 1]],
  ["titles (OSC, BEL or ST) are dropped", "\x1b]0;user@host\x07$ \x1b]2;t\x1b\\x", "$ x", [0, 3]],
  ["private modes and charsets are dropped", "\x1b[?2004h\x1b(Bok\x1b[?2004l\x1b=", "ok", [0, 2]],
  ["tabs go to the next multiple of 8", "a\tb", "a       b", [0, 9]],
  ["BEL and other controls are dropped", "a\x07\x00\x7fb", "ab", [0, 2]],
  ["UTF-8", "héllo → ✓", "héllo → ✓", [0, 9]],
  ["autowrap at the last column", "abcdefghijk", "abcdefghij\nk", [1, 1]],
];

function screenAfter(chunks) {
  const s = new Screen(10, 5);
  for (const c of chunks) s.write(c);
  return s;
}

describe("the console terminal's screen", () => {
  for (const [name, output, text, [row, col]] of CASES) {
    test(name, () => {
      const s = screenAfter([output]);
      assert.equal(s.text(), text);
      assert.deepEqual([s.row, s.col], [row, col]);
    });
  }

  test("every case reads the same however its bytes are split", () => {
    for (const [name, output, text] of CASES) {
      const bytes = new TextEncoder().encode(output);
      for (let at = 0; at <= bytes.length; at++) {
        const s = screenAfter([bytes.subarray(0, at), bytes.subarray(at)]);
        assert.equal(s.text(), text, `${name}, split at byte ${at}`);
      }
      const oneByOne = screenAfter([...bytes].map((b) => Uint8Array.of(b)));
      assert.equal(oneByOne.text(), text, `${name}, byte by byte`);
    }
  });

  test("output past the kept lines drops the oldest", () => {
    const s = new Screen(80, 24);
    for (let i = 0; i < 6000; i++) s.write(`line ${i}\r\n`);
    const lines = s.text().split("\n");
    assert.equal(lines.length, 5000);
    assert.equal(lines[0], "line 1001");
    assert.equal(lines.at(-2), "line 5999");
  });
});

describe("keys", () => {
  const key = (k, mods = {}) => keySequence({ key: k, ctrlKey: false, altKey: false, shiftKey: false, metaKey: false, ...mods });
  const KEYS = [
    ["a", {}, "a"], ["Enter", {}, "\r"], ["Backspace", {}, "\x7f"], ["Tab", {}, "\t"],
    ["ArrowUp", {}, "\x1b[A"], ["ArrowLeft", {}, "\x1b[D"], ["Delete", {}, "\x1b[3~"],
    ["c", { ctrlKey: true }, "\x03"], ["d", { ctrlKey: true }, "\x04"], ["[", { ctrlKey: true }, "\x1b"],
    ["b", { altKey: true }, "\x1bb"],
    // the browser's: copy and paste, and keys that are no input
    ["C", { ctrlKey: true, shiftKey: true }, null], ["V", { ctrlKey: true, shiftKey: true }, null],
    ["v", { metaKey: true }, null], ["Shift", {}, null], ["F5", {}, null],
  ];
  for (const [k, mods, seq] of KEYS) {
    test(`${JSON.stringify(mods)} ${k}`, () => assert.equal(key(k, mods), seq));
  }
});
