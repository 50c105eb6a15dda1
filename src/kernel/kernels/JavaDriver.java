// The Java driver of Cove's kernels (cove_repl_kernel.py has the protocol): one JShell for the
// kernel's life, so imports, classes, methods and variables stay between cells. It runs the
// snippets in this JVM (the "local" execution engine: no second JVM to start); SIGINT stops
// the snippet under way (JShell.stop) and leaves the state as it was.
//
// A snippet that throws is an error named EvalException with the exception's message (its
// class and stack in the traceback); one that does not compile is a CompilationError with
// javac's diagnostics. The value of a last expression is the result.
import java.io.BufferedInputStream;
import java.io.ByteArrayInputStream;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicBoolean;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;
import sun.misc.Signal;

public class JavaDriver {
    private static OutputStream control;
    private static final AtomicBoolean stopped = new AtomicBoolean();

    private static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    private static void say(String json) throws Exception {
        System.out.flush();
        System.err.flush();
        control.write((json + "\n").getBytes(StandardCharsets.UTF_8));
        control.flush();
    }

    private static void sayError(String ename, String evalue, List<String> traceback)
            throws Exception {
        StringBuilder tb = new StringBuilder("[");
        for (int i = 0; i < traceback.size(); i++)
            tb.append(i > 0 ? "," : "").append(quote(traceback.get(i)));
        tb.append(']');
        say("{\"error\":{\"ename\":" + quote(ename) + ",\"evalue\":" + quote(evalue)
            + ",\"traceback\":" + tb + "}}");
    }

    private static String readCell(InputStream in) throws Exception {
        StringBuilder length = new StringBuilder();
        int c;
        while ((c = in.read()) != '\n') {
            if (c < 0) return null;
            length.append((char) c);
        }
        byte[] code = in.readNBytes(Integer.parseInt(length.toString().trim()));
        return new String(code, StandardCharsets.UTF_8);
    }

    private static String diagnostics(JShell shell, Snippet snippet) {
        StringBuilder b = new StringBuilder();
        shell.diagnostics(snippet).forEach((Diag d) -> {
            if (b.length() > 0) b.append('\n');
            b.append(d.getMessage(Locale.ROOT));
        });
        return b.toString();
    }

    /* Runs one cell, snippet by snippet; stops at the first that fails. */
    private static void run(JShell shell, String code) throws Exception {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String remaining = code;
        String result = null;
        stopped.set(false);
        while (!remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            String source = info.source();
            if (info.completeness() == SourceCodeAnalysis.Completeness.DEFINITELY_INCOMPLETE
                    || source == null) {
                source = remaining; // let javac say what is missing
                remaining = "";
            } else {
                remaining = info.remaining();
            }
            result = null;
            for (SnippetEvent event : shell.eval(source)) {
                if (event.causeSnippet() != null) continue; // a dependent snippet's update
                JShellException e = event.exception();
                if (stopped.get()) {
                    sayError("KeyboardInterrupt", "interrupted",
                             List.of("KeyboardInterrupt: the execution was interrupted"));
                    return;
                }
                if (e instanceof EvalException) {
                    EvalException ee = (EvalException) e;
                    List<String> tb = new ArrayList<>();
                    tb.add(ee.getExceptionClassName() + ": " + ee.getMessage());
                    for (StackTraceElement frame : ee.getStackTrace())
                        if (!frame.getClassName().startsWith("jdk.")
                                && !frame.getClassName().startsWith("java."))
                            tb.add("\tat " + frame);
                    sayError("EvalException", ee.getMessage() == null ? ee.getExceptionClassName()
                                                                      : ee.getMessage(), tb);
                    return;
                }
                if (e instanceof UnresolvedReferenceException) {
                    String message = "unresolved reference in "
                        + ((UnresolvedReferenceException) e).getSnippet().source().trim();
                    sayError("UnresolvedReferenceException", message, List.of(message));
                    return;
                }
                if (event.status() == Snippet.Status.REJECTED) {
                    String message = diagnostics(shell, event.snippet());
                    List<String> tb = new ArrayList<>(List.of(message.split("\n")));
                    tb.add(0, "CompilationError: " + event.snippet().source().trim());
                    sayError("CompilationError", message, tb);
                    return;
                }
                Snippet s = event.snippet();
                boolean expression = s.kind() == Snippet.Kind.EXPRESSION
                    || (s.kind() == Snippet.Kind.VAR
                        && s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND);
                if (expression && event.value() != null)
                    result = event.value();
            }
        }
        if (result != null) say("{\"result\":" + quote(result) + "}");
    }

    public static void main(String[] args) throws Exception {
        control = new FileOutputStream("/proc/self/fd/3");
        // A buffered stream: FileInputStream.readNBytes seeks, which a pipe cannot (JDK 17).
        InputStream in = new BufferedInputStream(new FileInputStream("/proc/self/fd/4"));
        JShell shell = JShell.builder()
            .executionEngine("local")
            .out(System.out)
            .err(System.err)
            .in(new ByteArrayInputStream(new byte[0]))
            .build();
        Signal.handle(new Signal("INT"), signal -> {
            stopped.set(true);
            shell.stop();
        });
        shell.eval("import java.util.*;");
        shell.eval("import java.util.stream.*;");
        shell.eval("import java.io.*;");
        String code;
        while ((code = readCell(in)) != null) {
            try {
                run(shell, code);
            } catch (Exception e) {
                sayError(e.getClass().getSimpleName(), String.valueOf(e.getMessage()),
                         List.of(e.toString()));
            }
            say("{\"done\":true}");
        }
        shell.close();
    }
}
