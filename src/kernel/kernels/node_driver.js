// The JavaScript and TypeScript driver of Cove's kernels (cove_repl_kernel.py has the
// protocol): one vm context for the kernel's life, so what a cell declares stays.
//
// Each cell is parsed with TypeScript's compiler (Debian's node-typescript; TypeScript cells
// are transpiled with it first, types are not checked) and its top-level declarations are
// rewritten so that they outlive the cell and may be declared again by a later one, as in a
// notebook: `let`/`const` become `var`, a class becomes a var holding it. A cell with a
// top-level `await` runs as an async function whose declarations are hoisted to the context.
// The value of a last expression statement is the result (awaited when it is a promise).
'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { Console } = require('console');
const { createRequire } = require('module');

const language = process.argv[2] || 'javascript';
let ts = null;
for (const name of ['typescript', '/usr/share/nodejs/typescript']) {
  try {
    ts = require(name);
    break;
  } catch (e) { /* next */ }
}
if (ts === null && language === 'typescript') {
  process.stderr.write('cove node driver: TypeScript needs the typescript module ' +
                       '(Debian: node-typescript)\n');
  process.exit(3);
}

const control = fs.openSync('/proc/self/fd/3', 'w');
function say(message) {
  fs.writeSync(control, JSON.stringify(message) + '\n');
}

const cwdRequire = createRequire(path.join(process.cwd(), 'cell.js'));
const sandbox = {
  console: new Console({ stdout: process.stdout, stderr: process.stderr }),
  require: cwdRequire,
  module: { exports: {} },
  process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder, AbortController,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, structuredClone, fetch: globalThis.fetch,
};
sandbox.exports = sandbox.module.exports;
const context = vm.createContext(sandbox);

// ---- the rewriting of a cell's top level ----

function bindingNames(name, out) {
  if (ts.isIdentifier(name)) {
    out.push(name.text);
  } else {
    for (const element of name.elements) {
      if (!ts.isOmittedExpression(element)) bindingNames(element.name, out);
    }
  }
  return out;
}

function hasTopLevelAwait(node) {
  let found = false;
  (function visit(n) {
    if (found) return;
    if (ts.isFunctionLike(n) || ts.isClassLike(n)) return;
    if (ts.isAwaitExpression(n) || (ts.isForOfStatement(n) && n.awaitModifier)) {
      found = true;
      return;
    }
    ts.forEachChild(n, visit);
  })(node);
  return found;
}

// Returns {code, hoisted, lastExpression: [start, end] or null} for the JavaScript text js.
function rewrite(js) {
  const file = ts.createSourceFile('cell.js', js, ts.ScriptTarget.Latest, true, ts.ScriptKind.JS);
  const isAsync = hasTopLevelAwait(file);
  const edits = []; // [start, end, text], non-overlapping
  const hoisted = [];
  const statements = file.statements;
  for (const s of statements) {
    if (ts.isVariableStatement(s)) {
      const list = s.declarationList;
      const keywordStart = list.getStart(file);
      const keyword = (list.flags & ts.NodeFlags.Const) ? 'const' :
        (list.flags & ts.NodeFlags.Let) ? 'let' : 'var';
      if (!isAsync) {
        edits.push([keywordStart, keywordStart + keyword.length, 'var']);
        continue;
      }
      // var a = 1, {b} = o;  ->  (a = 1, ({b} = o));  with a and b hoisted
      const parts = [];
      for (const d of list.declarations) {
        bindingNames(d.name, hoisted);
        if (d.initializer) parts.push(`(${d.name.getText(file)} = ${d.initializer.getText(file)})`);
      }
      edits.push([s.getStart(file), s.end, parts.length ? parts.join(', ') + ';' : ';']);
    } else if (ts.isClassDeclaration(s) && s.name) {
      if (isAsync) hoisted.push(s.name.text);
      const start = s.getStart(file);
      edits.push([start, start, (isAsync ? '' : 'var ') + `${s.name.text} = `]);
      edits.push([s.end, s.end, ';']);
    } else if (ts.isFunctionDeclaration(s) && s.name && isAsync) {
      edits.push([s.end, s.end, `\nglobalThis[${JSON.stringify(s.name.text)}] = ${s.name.text};`]);
    }
  }
  const last = statements.length ? statements[statements.length - 1] : null;
  let lastExpression = null;
  if (last && ts.isExpressionStatement(last)) {
    lastExpression = [last.expression.getStart(file), last.expression.end];
  }
  if (isAsync && lastExpression) {
    edits.push([lastExpression[0], lastExpression[0], 'return ('], [lastExpression[1], lastExpression[1], ')']);
  }
  edits.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let out = '';
  let at = 0;
  for (const [start, end, text] of edits) {
    out += js.slice(at, start) + text;
    at = end;
  }
  out += js.slice(at);
  if (isAsync) out = `(async () => {\n${out}\n})()`;
  return { code: out, hoisted, isAsync, hasResult: lastExpression !== null };
}

function transpile(code) {
  const output = ts.transpileModule(code, {
    reportDiagnostics: true,
    compilerOptions: {
      target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, esModuleInterop: true,
    },
  });
  const errors = (output.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
  if (errors.length) {
    const messages = errors.map((d) => {
      const text = ts.flattenDiagnosticMessageText(d.messageText, '\n');
      if (d.file && d.start !== undefined) {
        const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
        return `(${line + 1},${character + 1}): ${text}`;
      }
      return text;
    });
    const error = new SyntaxError(messages.join('\n'));
    error.stack = `TSError: ${messages.join('\n')}`;
    error.name = 'TSError';
    throw error;
  }
  return output.outputText.replace(/^"use strict";\n/, '');
}

// ---- running a cell ----

function describe(error) {
  if (error instanceof Error || (error && typeof error === 'object' && 'message' in error)) {
    const name = error.name || (error.constructor && error.constructor.name) || 'Error';
    const stack = typeof error.stack === 'string' ? error.stack : `${name}: ${error.message}`;
    // The driver's own frames (vm, this file, node's internals) are not the user's.
    const lines = stack.split('\n').filter((l) => !/\((node:|.*node_driver\.js)|at sigintHandlersWrap|at node:/.test(l));
    return { ename: String(name), evalue: String(error.message), traceback: lines };
  }
  return { ename: 'Error', evalue: util.inspect(error), traceback: [`Uncaught ${util.inspect(error)}`] };
}

function isInterrupt(error) {
  return error && error.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
}

let waiting = null; // the reject of a cell awaiting a promise, for SIGINT
process.on('SIGINT', () => {
  if (waiting) waiting(Object.assign(new Error('Script execution interrupted.'),
                                     { code: 'ERR_SCRIPT_EXECUTION_INTERRUPTED' }));
});
process.on('uncaughtException', (error) => {
  process.stderr.write(`Uncaught ${describe(error).traceback.join('\n')}\n`);
});
process.on('unhandledRejection', (error) => {
  process.stderr.write(`Uncaught (in promise) ${describe(error).traceback.join('\n')}\n`);
});

async function runCell(source) {
  let js = language === 'typescript' ? transpile(source) : source;
  let plan = { code: js, hoisted: [], isAsync: false, hasResult: true };
  if (ts !== null) {
    try {
      plan = rewrite(js);
    } catch (e) { /* a cell the parser cannot take: run it as written */ }
  }
  if (plan.hoisted.length) vm.runInContext(`var ${plan.hoisted.join(', ')};`, context);
  const script = new vm.Script(plan.code, { filename: `cell[${count}]` });
  let value = script.runInContext(context, { breakOnSigint: true, displayErrors: false });
  if (value && typeof value.then === 'function' && (plan.isAsync || plan.hasResult)) {
    value = await new Promise((resolve, reject) => {
      waiting = reject;
      value.then(resolve, reject);
    }).finally(() => { waiting = null; });
  }
  return plan.hasResult ? value : undefined;
}

let count = 0;
async function execute(source) {
  count++;
  try {
    const value = await runCell(source);
    if (value !== undefined) say({ result: util.inspect(value) });
  } catch (error) {
    if (isInterrupt(error)) {
      say({ error: { ename: 'KeyboardInterrupt', evalue: 'interrupted', traceback: ['KeyboardInterrupt: the execution was interrupted'] } });
    } else {
      say({ error: describe(error) });
    }
  }
  say({ done: true });
}

// Cells arrive as "<length>\n<code>"; one runs at a time.
let input = Buffer.alloc(0);
let busy = false;
async function pump() {
  if (busy) return;
  busy = true;
  for (;;) {
    const newline = input.indexOf(10);
    if (newline < 0) break;
    const length = parseInt(input.subarray(0, newline).toString(), 10);
    if (input.length < newline + 1 + length) break;
    const code = input.subarray(newline + 1, newline + 1 + length).toString();
    input = input.subarray(newline + 1 + length);
    await execute(code);
  }
  busy = false;
}
// On descriptor 4: stdin is the user's code's (/dev/null).
const cells = fs.createReadStream(null, { fd: 4 });
cells.on('data', (chunk) => {
  input = Buffer.concat([input, chunk]);
  pump();
});
cells.on('end', () => process.exit(0));
