"""`cove mcp install`: each client's config file written into a temporary HOME (and project
directory), merged with what is there, never clobbering other servers or settings; --print
writes nothing; a file that does not parse is left alone (exit status 2). The files are read
back as their clients read them: JSON, and TOML with Python's tomllib. (tests/compat/mcp.test.mjs
has Claude Code and Codex themselves read them.)"""
import json
import os
import stat
import subprocess
import tomllib

import pytest

from covetest import CLI

SERVER = "http://127.0.0.1:8089"

# target, scope -> (path under HOME or the project, key of the servers, the entry)
FILES = {
    ("claude", "project"): ("project", ".mcp.json", "mcpServers", True),
    ("claude", "user"): ("home", ".claude.json", "mcpServers", True),
    ("cursor", "user"): ("home", ".cursor/mcp.json", "mcpServers", False),
    ("cursor", "project"): ("project", ".cursor/mcp.json", "mcpServers", False),
    ("vscode", "user"): ("home", ".config/Code/User/mcp.json", "servers", True),
    ("vscode", "project"): ("project", ".vscode/mcp.json", "servers", True),
}


@pytest.fixture
def places(tmp_path):
    home = tmp_path / "home"
    project = tmp_path / "project"
    home.mkdir()
    project.mkdir()
    return {"home": home, "project": project}


def install(places, *args, server=SERVER, check=True):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(places["home"])}
    if server:
        env["COVE_SERVER"] = server
    r = subprocess.run([CLI, "mcp", "install", *args], cwd=places["project"], env=env,
                       capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def tree(root):
    """Every file below root with its bytes, to show nothing changed."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[p] = f.read()
    return out


@pytest.mark.parametrize("target,scope", sorted(FILES))
def test_json_targets_merge_and_keep_the_rest(places, target, scope):
    where, rel, key, typed = FILES[(target, scope)]
    path = places[where] / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    other = {"command": "other-server", "args": ["--x"]}
    path.write_text(json.dumps({"theme": "dark", key: {"other": other}}, indent=4))
    os.chmod(path, 0o640)
    install(places, "--target", target, "--scope", scope)
    install(places, "--target", target, "--scope", scope)  # again: the same one entry
    data = json.loads(path.read_text())
    assert data["theme"] == "dark"
    assert data[key]["other"] == other
    entry = data[key]["cove"]
    expected = {"command": CLI, "args": ["mcp"], "env": {"COVE_SERVER": SERVER}}
    if typed:
        expected["type"] = "stdio"
    assert entry == expected
    assert list(data[key]) == ["other", "cove"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640  # an existing file keeps its mode
    leftovers = [n for n in os.listdir(path.parent) if ".cove-" in n]
    assert leftovers == []


def test_defaults_and_new_files(places):
    # claude defaults to the project, the others to the user; new files are private
    install(places, "--target", "claude")
    install(places, "--target", "cursor")
    install(places, "--target", "vscode")
    install(places, "--target", "codex", server=None)
    assert (places["project"] / ".mcp.json").exists()
    assert not (places["home"] / ".claude.json").exists()
    assert (places["home"] / ".cursor/mcp.json").exists()
    assert (places["home"] / ".config/Code/User/mcp.json").exists()
    codex = places["home"] / ".codex/config.toml"
    assert stat.S_IMODE(os.stat(codex).st_mode) == 0o600
    entry = tomllib.loads(codex.read_text())["mcp_servers"]["cove"]
    assert entry == {"command": CLI, "args": ["mcp"]}  # no COVE_SERVER when none was given


def test_the_key_is_written_only_when_given(places):
    env_key = {"COVE_API_KEY": "from-env"}
    r = subprocess.run([CLI, "mcp", "install", "--target", "cursor"], cwd=places["project"],
                       env={"PATH": "/usr/bin:/bin", "HOME": str(places["home"]), **env_key},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    text = (places["home"] / ".cursor/mcp.json").read_text()
    assert "from-env" not in text
    install(places, "--target", "cursor", "--api-key", "given-key")
    entry = json.loads((places["home"] / ".cursor/mcp.json").read_text())["mcpServers"]["cove"]
    assert entry["env"] == {"COVE_SERVER": SERVER, "COVE_API_KEY": "given-key"}


CODEX_BEFORE = '''# my settings
model = "o4-mini"   # a comment
approval_policy = "on-request"

[mcp_servers.other]
command = "npx"
args = ["-y", "other-server"]

[mcp_servers.cove]
command = "/old/cove"
args = ["mcp", "--old"]

[mcp_servers.cove.env]
OLD = "1"

[profiles.fast]
model = "gpt-x"
notes = """
[mcp_servers.cove]
not a table: inside a string
"""
matrix = [
  [1, 2],
  [3, 4],
]
'''


def test_codex_replaces_only_its_table(places):
    path = places["home"] / ".codex/config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(CODEX_BEFORE)
    install(places, "--target", "codex")
    text = path.read_text()
    data = tomllib.loads(text)
    assert data["mcp_servers"]["cove"] == {"command": CLI, "args": ["mcp"],
                                           "env": {"COVE_SERVER": SERVER}}
    assert data["mcp_servers"]["other"] == {"command": "npx", "args": ["-y", "other-server"]}
    assert data["model"] == "o4-mini" and data["profiles"]["fast"]["matrix"] == [[1, 2], [3, 4]]
    assert "[mcp_servers.cove]\nnot a table" in data["profiles"]["fast"]["notes"]
    # every byte outside the cove table kept, in place
    before, _, rest = CODEX_BEFORE.partition("[mcp_servers.cove]\ncommand")
    after = rest[rest.index("[profiles.fast]"):]
    assert text.startswith(before)
    assert text.endswith(after)
    assert "/old/cove" not in text and "OLD" not in text
    # a second run changes nothing
    install(places, "--target", "codex")
    assert path.read_text() == text


def test_codex_appends_when_absent(places):
    path = places["home"] / ".codex/config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('model = "o4"')  # no newline at the end
    install(places, "--target", "codex")
    text = path.read_text()
    assert text.startswith('model = "o4"\n\n[mcp_servers.cove]\n')
    assert tomllib.loads(text)["model"] == "o4"


def test_print_writes_nothing(places):
    (places["project"] / ".mcp.json").write_text('{"mcpServers": {}}')
    before = tree(places["home"].parent)
    for target in ("claude", "cursor", "vscode", "codex"):
        r = install(places, "--target", target, "--print")
        assert CLI in r.stdout
        body = r.stdout.split("\n", 1)[1]
        if target == "codex":
            assert tomllib.loads(body)["mcp_servers"]["cove"]["command"] == CLI
        else:
            body = body.split("\n# or: ", 1)[0]
            key = "servers" if target == "vscode" else "mcpServers"
            assert json.loads(body)[key]["cove"]["args"] == ["mcp"]
        if target == "claude":
            assert "claude mcp add --scope project" in r.stdout
    assert tree(places["home"].parent) == before


@pytest.mark.parametrize("target,rel,text", [
    ("claude", ".mcp.json", '{"mcpServers": {"other": {}},'),
    ("claude", ".mcp.json", '["not", "an", "object"]'),
    ("claude", ".mcp.json", '{"mcpServers": []}'),
    ("vscode", ".vscode/mcp.json", '{\n  // VS Code allows comments; we cannot keep them\n}'),
    ("codex", ".codex/config.toml", 'model = "o4\n'),
    ("codex", ".codex/config.toml", 'notes = """\nnever closed\n'),
    ("codex", ".codex/config.toml", '[mcp_servers.cove\ncommand = "x"\n'),
    ("codex", ".codex/config.toml", 'mcp_servers.cove.command = "x"\n'),
    ("codex", ".codex/config.toml", '[mcp_servers]\ncove = { command = "x" }\n'),
])
def test_unparsable_files_are_refused(places, target, rel, text):
    scope = "user" if target == "codex" else "project"
    path = places["home" if scope == "user" else "project"] / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    before = tree(places["home"].parent)
    r = install(places, "--target", target, "--scope", scope, check=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "nothing written" in r.stderr
    assert tree(places["home"].parent) == before


def test_bad_usage(places):
    for args in (["--target", "emacs"], ["--target", "claude", "--scope", "global"], []):
        r = install(places, *args, check=False)
        assert r.returncode == 2, r.stderr


def test_symlinked_config_stays_a_link(places, tmp_path):
    real = tmp_path / "dotfiles" / "claude.json"
    real.parent.mkdir()
    real.write_text('{"keep": 1}')
    os.symlink(real, places["home"] / ".claude.json")
    install(places, "--target", "claude", "--scope", "user")
    assert os.path.islink(places["home"] / ".claude.json")
    data = json.loads(real.read_text())
    assert data["keep"] == 1 and data["mcpServers"]["cove"]["command"] == CLI
