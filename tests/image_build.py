"""OCI images built by the tests, in Python: layers as tar files (gzip, zstd through the `zstd`
command line when it is installed, or plain), OCI image layouts pushed to a test registry with
`skopeo copy`, `docker save`-style archives and tars of OCI layouts for POST /v1/images/import.

Images:
- busybox_image(): Debian's static busybox in three layers; a later layer removes a file
  (.wh.), makes a directory opaque (.wh..wh..opq) and adds a hard link pair; a config with Env,
  WorkingDir, User 1000:1000 and Entrypoint/Cmd.
- python_image(): the busybox layer (the same blob) under the host's python3, the libraries
  `ldd` lists and the stdlib less its tests, tkinter, lib2to3 and config dir (about 35 MB).
- multi_platform(): an OCI index with linux/amd64 (the busybox image) and linux/arm64 (a
  manifest whose layer is garbage).
- hostile_layer(): one layer from raw tar members, for the security tests."""

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile

BUSYBOX = "/bin/busybox" if os.path.exists("/bin/busybox") else shutil.which("busybox")
SKOPEO = shutil.which("skopeo") or "/usr/bin/skopeo"
ZSTD = shutil.which("zstd")
HOST_PYTHON = "/usr/bin/python3"

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
            "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
            None: "application/vnd.oci.image.layer.v1.tar"}
MTIME = 1700000000  # every entry's mtime: the same layer gives the same blob
APPLETS = ("sh", "ls", "cat", "id", "pwd", "env", "echo", "stat", "sleep", "test", "tail",
           "true", "false", "readlink", "find", "wc", "head", "mkdir", "touch", "rm", "grep",
           "ps", "kill", "du", "printf", "[")


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def zstd_available():
    return ZSTD is not None


# ---- layers ----------------------------------------------------------------------------------

class Tar:
    """A layer's tar, entry by entry (names relative, as Docker writes them)."""

    def __init__(self):
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)
        self.done = None

    def _info(self, name, type_, mode, uid, gid):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid, info.mtime = type_, mode, uid, gid, MTIME
        info.uname = info.gname = ""
        return info

    def dir(self, name, mode=0o755, uid=0, gid=0):
        self.tar.addfile(self._info(name.rstrip("/") + "/", tarfile.DIRTYPE, mode, uid, gid))
        return self

    def file(self, name, data=b"", mode=0o644, uid=0, gid=0):
        if isinstance(data, str):
            data = data.encode()
        info = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))
        return self

    def host_file(self, name, path, mode=None, uid=0, gid=0):
        st = os.stat(path)
        info = self._info(name, tarfile.REGTYPE, stat.S_IMODE(st.st_mode) if mode is None
                          else mode, uid, gid)
        info.size = st.st_size
        with open(path, "rb") as f:
            self.tar.addfile(info, f)
        return self

    def symlink(self, name, target, uid=0, gid=0):
        info = self._info(name, tarfile.SYMTYPE, 0o777, uid, gid)
        info.linkname = target
        self.tar.addfile(info)
        return self

    def hardlink(self, name, target):
        info = self._info(name, tarfile.LNKTYPE, 0o644, 0, 0)
        info.linkname = target
        self.tar.addfile(info)
        return self

    def whiteout(self, path):
        d, base = os.path.split(path)
        return self.file(os.path.join(d, ".wh." + base))

    def opaque(self, dir_):
        return self.file(os.path.join(dir_, ".wh..wh..opq"))

    def raw(self, info, data=None):
        """A member exactly as given (hostile names, types, modes)."""
        if data is not None:
            info.size = len(data)
            self.tar.addfile(info, io.BytesIO(data))
        else:
            self.tar.addfile(info)
        return self

    def bytes(self):
        if self.done is None:
            self.tar.close()
            self.done = self.buf.getvalue()
        return self.done


def compress(data, how):
    if how == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if how == "zstd":
        return subprocess.run([ZSTD, "-q", "-c", "-3"], input=data, capture_output=True,
                              check=True).stdout
    return data


class Layer:
    """A layer blob: the tar (its digest is the diff id) and the blob (compressed) pushed."""

    def __init__(self, tar_bytes, compression="gzip"):
        if compression == "zstd" and not zstd_available():
            compression = "gzip"
        self.tar = tar_bytes
        self.compression = compression
        self.blob = compress(tar_bytes, compression)
        self.digest = sha256(self.blob)
        self.diff_id = sha256(tar_bytes)
        self.media_type = MT_LAYER[compression]
        self.size = len(self.blob)

    def desc(self):
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def image_config(layers, env=None, entrypoint=None, cmd=None, working_dir="", user="",
                 arch="amd64", os_="linux", diff_ids=None):
    cfg = {}
    if env is not None:
        cfg["Env"] = list(env)
    if entrypoint is not None:
        cfg["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        cfg["Cmd"] = list(cmd)
    if working_dir:
        cfg["WorkingDir"] = working_dir
    if user:
        cfg["User"] = user
    return {"created": "2026-01-01T00:00:00Z", "architecture": arch, "os": os_, "config": cfg,
            "rootfs": {"type": "layers",
                       "diff_ids": diff_ids if diff_ids is not None
                       else [l.diff_id for l in layers]},
            "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "cove tests"}
                        for _ in layers]}


class Image:
    """Layers and a config: what a manifest names."""

    def __init__(self, layers, config):
        self.layers = list(layers)
        self.config = config
        self.config_blob = json.dumps(config, sort_keys=True).encode()
        self.config_digest = sha256(self.config_blob)
        manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST,
                    "config": {"mediaType": MT_CONFIG, "digest": self.config_digest,
                               "size": len(self.config_blob)},
                    "layers": [l.desc() for l in self.layers]}
        self.manifest_blob = json.dumps(manifest, sort_keys=True).encode()
        self.digest = sha256(self.manifest_blob)

    @property
    def id(self):
        return self.digest.split(":", 1)[1]

    def desc(self, platform=None, annotations=None):
        d = {"mediaType": MT_MANIFEST, "digest": self.digest, "size": len(self.manifest_blob)}
        if platform:
            d["platform"] = platform
        if annotations:
            d["annotations"] = annotations
        return d

    def unpacked_size(self):
        return sum(len(l.tar) for l in self.layers)


class Index:
    """An OCI image index over images (platform dicts alongside)."""

    def __init__(self, entries):
        self.entries = list(entries)  # (Image, platform)
        index = {"schemaVersion": 2, "mediaType": MT_INDEX,
                 "manifests": [img.desc(platform=p) for img, p in self.entries]}
        self.blob = json.dumps(index, sort_keys=True).encode()
        self.digest = sha256(self.blob)

    def desc(self, annotations=None):
        d = {"mediaType": MT_INDEX, "digest": self.digest, "size": len(self.blob)}
        if annotations:
            d["annotations"] = annotations
        return d


# ---- OCI layouts -----------------------------------------------------------------------------

class OciLayout:
    """An OCI image layout directory (oci-layout, index.json, blobs/sha256/...)."""

    def __init__(self, path):
        self.path = str(path)
        os.makedirs(os.path.join(self.path, "blobs", "sha256"), exist_ok=True)
        with open(os.path.join(self.path, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        self.manifests = []
        self._write_index()

    def blob(self, data):
        digest = sha256(data)
        p = os.path.join(self.path, "blobs", "sha256", digest.split(":", 1)[1])
        if not os.path.exists(p):
            with open(p, "wb") as f:
                f.write(data)
        return digest

    def _write_index(self):
        with open(os.path.join(self.path, "index.json"), "w") as f:
            json.dump({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": self.manifests},
                      f)

    def _image_blobs(self, img):
        for l in img.layers:
            self.blob(l.blob)
        self.blob(img.config_blob)
        self.blob(img.manifest_blob)

    def add(self, img, tag, name=None):
        """img: an Image or an Index; tag: org.opencontainers.image.ref.name (what skopeo's
        oci:DIR:TAG looks up; None: no name at all); name: io.containerd.image.name, if any."""
        ann = {"org.opencontainers.image.ref.name": tag} if tag else {}
        if name:
            ann["io.containerd.image.name"] = name
        if isinstance(img, Index):
            for sub, _ in img.entries:
                self._image_blobs(sub)
            self.blob(img.blob)
        else:
            self._image_blobs(img)
        self.manifests.append(img.desc(annotations=ann))
        self._write_index()
        return img

    def tar(self, compression=None):
        """The layout as a tar (for POST /v1/images/import)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for name in ("oci-layout", "index.json"):
                t.add(os.path.join(self.path, name), arcname=name)
            t.add(os.path.join(self.path, "blobs"), arcname="blobs")
        return compress(buf.getvalue(), compression)


def docker_save_archive(img, repo_tags, compression=None):
    """A `docker save` archive (the classic layout: manifest.json, the config as HEX.json and
    one HEX/layer.tar per layer, uncompressed, plus `repositories`)."""
    buf = io.BytesIO()
    cfg_hex = img.config_digest.split(":", 1)[1]

    def add(t, name, data):
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), MTIME, 0o644
        t.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=buf, mode="w") as t:
        layer_paths = []
        for l in img.layers:
            hex_ = l.diff_id.split(":", 1)[1]
            d = tarfile.TarInfo(hex_ + "/")
            d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, MTIME
            t.addfile(d)
            add(t, hex_ + "/VERSION", b"1.0")
            add(t, hex_ + "/layer.tar", l.tar)
            layer_paths.append(hex_ + "/layer.tar")
        add(t, cfg_hex + ".json", img.config_blob)
        add(t, "manifest.json", json.dumps([{"Config": cfg_hex + ".json", "RepoTags":
                                             list(repo_tags), "Layers": layer_paths}]).encode())
        repos = {}
        for rt in repo_tags:
            name, tag = rt.rsplit(":", 1)
            repos.setdefault(name, {})[tag] = layer_paths[-1].split("/")[0]
        add(t, "repositories", json.dumps(repos).encode())
    return compress(buf.getvalue(), compression)


def skopeo_push(layout, tag, dest, creds=None, all_platforms=False):
    """Pushes oci:LAYOUT:TAG to docker://DEST (HOST:PORT/REPO:TAG) over plain HTTP."""
    args = [SKOPEO, "--insecure-policy", "copy", "-q", "--dest-tls-verify=false"]
    if creds:
        args += ["--dest-creds", creds]
    if all_platforms:
        args += ["--all"]
    args += ["--preserve-digests"]
    args += [f"oci:{layout.path if isinstance(layout, OciLayout) else layout}:{tag}",
             f"docker://{dest}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"skopeo copy to {dest} failed: {r.stderr.strip()}")


# ---- the test images -------------------------------------------------------------------------

def busybox_base_tar(tar=None, work_owner=1000):
    """The busybox layer: /bin/busybox, its applets as symlinks, the usual directories."""
    t = tar or Tar()
    for d in ("bin", "dev", "proc", "sys", "etc", "root", "usr", "usr/share", "var"):
        t.dir(d)
    t.dir("tmp", mode=0o1777)
    t.host_file("bin/busybox", BUSYBOX, mode=0o755)
    for a in APPLETS:
        t.symlink("bin/" + a, "busybox")
    t.file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"
           "user:x:1000:1000:user:/work:/bin/sh\n")
    t.file("etc/group", "root:x:0:\nuser:x:1000:\n")
    t.dir("work", uid=work_owner, gid=work_owner)
    return t


BUSYBOX_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello", "LAYERED=image"]
BUSYBOX_ENTRYPOINT = ["/bin/sh", "-c"]
BUSYBOX_CMD = ["echo \"$GREETING from $(id -u)\" > /tmp/entrypoint-ran; exec sleep 3600"]


def busybox_layers(zstd=True):
    """Three layers (the middle one zstd when asked and the `zstd` command is installed):
    1. busybox, /etc/removed-later, /opt/lower/{a,b}, /etc/motd ("one")
    2. removes /etc/removed-later (.wh.), makes /opt/lower opaque with /opt/lower/new in it,
       adds /data/hard1 and its hard link /data/hard2, /etc/layer2
    3. /etc/motd ("three"), /work/hello.txt owned by 1000:1000."""
    t1 = busybox_base_tar()
    t1.file("etc/removed-later", "must be whited out\n")
    t1.dir("opt").dir("opt/lower").file("opt/lower/a", "lower a\n").file("opt/lower/b",
                                                                          "lower b\n")
    t1.dir("opt/lower/sub").file("opt/lower/sub/c", "lower c\n")
    t1.file("etc/motd", "one\n")
    t2 = Tar()
    t2.dir("etc").whiteout("etc/removed-later").file("etc/layer2", "from layer two\n")
    t2.dir("opt").dir("opt/lower").opaque("opt/lower").file("opt/lower/new", "upper new\n")
    t2.dir("data").file("data/hard1", "linked twice\n").hardlink("data/hard2", "data/hard1")
    t3 = Tar()
    t3.dir("etc").file("etc/motd", "three\n")
    t3.dir("work", uid=1000, gid=1000).file("work/hello.txt", "hello from the image\n",
                                            uid=1000, gid=1000)
    return [Layer(t1.bytes(), "gzip"), Layer(t2.bytes(), "zstd" if zstd else "gzip"),
            Layer(t3.bytes(), "gzip")]


def busybox_image(env=BUSYBOX_ENV, entrypoint=BUSYBOX_ENTRYPOINT, cmd=BUSYBOX_CMD,
                  working_dir="/work", user="1000:1000", zstd=True):
    layers = busybox_layers(zstd)
    return Image(layers, image_config(layers, env=env, entrypoint=entrypoint, cmd=cmd,
                                      working_dir=working_dir, user=user))


PY_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data",
           "dist-packages", "site-packages", "distutils"}


def _host_path_entries(t, path, seen):
    """Adds a host path to the tar as it is on the host: every symlink on the way (the /lib ->
    usr/lib of a merged /usr, the libraries' version links) and the file it ends at."""
    parts = path.strip("/").split("/")
    cur = ""
    for i, part in enumerate(parts):
        cur = cur + "/" + part
        if cur in seen:
            if os.path.islink(cur):
                target = os.path.normpath(os.path.join(os.path.dirname(cur),
                                                       os.readlink(cur)))
                return _host_path_entries(t, target + "/" + "/".join(parts[i + 1:])
                                          if i + 1 < len(parts) else target, seen)
            continue
        seen.add(cur)
        if os.path.islink(cur):
            link = os.readlink(cur)
            t.symlink(cur.lstrip("/"), link)
            target = os.path.normpath(os.path.join(os.path.dirname(cur), link))
            rest = "/".join(parts[i + 1:])
            return _host_path_entries(t, target + ("/" + rest if rest else ""), seen)
        if os.path.isdir(cur):
            t.dir(cur.lstrip("/"))
        else:
            t.host_file(cur.lstrip("/"), cur)


def _ldd(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        f = line.split()
        if "=>" in f and len(f) >= 3 and f[2].startswith("/"):
            libs.append(f[2])
        elif f and f[0].startswith("/"):
            libs.append(f[0])
    return libs


def python_layer():
    """The host's python3 with its libraries and its stdlib less the tests, tkinter, lib2to3,
    the config dir (25 MB of static library) and the installed packages."""
    t = Tar()
    seen = {"/bin", "/etc", "/usr", "/tmp", "/root", "/var", "/usr/share", "/dev", "/proc",
            "/sys", "/usr/bin"}  # in the busybox layer below, or made just below
    t.dir("usr").dir("usr/bin")
    exe = os.path.realpath(HOST_PYTHON)
    _host_path_entries(t, HOST_PYTHON, seen)
    ver = os.path.basename(exe)  # python3.11
    stdlib = f"/usr/lib/{ver}"
    libs = set(_ldd(exe))
    for dirpath, dirnames, filenames in os.walk(stdlib):
        rel = os.path.relpath(dirpath, stdlib)
        if rel == ".":
            dirnames[:] = sorted(d for d in dirnames if d not in PY_SKIP
                                 and not d.startswith("config-"))
        else:
            dirnames.sort()
        _host_path_entries(t, dirpath, seen)
        for d in [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            _host_path_entries(t, os.path.join(dirpath, d), seen)  # as the link it is
            dirnames.remove(d)
        for fn in sorted(filenames):
            p = os.path.join(dirpath, fn)
            if os.path.islink(p) or os.path.isfile(p):
                _host_path_entries(t, p, seen)
            if fn.endswith(".so"):
                libs.update(_ldd(p))
    for lib in sorted(libs):
        _host_path_entries(t, lib, seen)
    return Layer(t.bytes(), "gzip")


PYTHON_ENV = ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"]


def python_image(base_layer=None):
    """busybox (the very blob of busybox_layers()[0] when given) and python3 on top. No
    Entrypoint or Cmd: a sandbox created without an entrypoint runs the default."""
    base = base_layer or Layer(busybox_base_tar().bytes(), "gzip")
    layers = [base, python_layer()]
    return Image(layers, image_config(layers, env=PYTHON_ENV, working_dir="/", user=""))


def garbage_layer(size=4096):
    data = b"\x1f\x8b\x08\x00" + os.urandom(size)  # a gzip magic, then nothing gzip
    layer = Layer.__new__(Layer)
    layer.tar, layer.compression, layer.blob = data, "gzip", data
    layer.digest = layer.diff_id = sha256(data)
    layer.media_type, layer.size = MT_LAYER["gzip"], len(data)
    return layer


def multi_platform(amd64_image):
    """An index: linux/amd64 -> amd64_image, linux/arm64 -> an image whose layer is garbage
    (a pull that picked it would fail to unpack)."""
    bad = garbage_layer()
    arm = Image([bad], image_config([bad], env=["PATH=/bin", "PLATFORM=arm64"],
                                    arch="arm64"))
    return Index([(arm, {"architecture": "arm64", "os": "linux", "variant": "v8"}),
                  (amd64_image, {"architecture": "amd64", "os": "linux"})])


def single_layer_image(tar_bytes, compression="gzip", env=("PATH=/bin",), under_busybox=True):
    """An image of busybox and one more layer (a hostile one, for the security tests)."""
    layers = []
    if under_busybox:
        layers.append(Layer(busybox_base_tar().bytes(), "gzip"))
    layers.append(Layer(tar_bytes, compression))
    return Image(layers, image_config(layers, env=list(env)))


def gzip_bomb(name="bomb", size=1 << 30, chunk=1 << 20):
    """A layer (tar+gzip) holding one file of `size` zero bytes: about 1 MB per GiB."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, MTIME
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    co = __import__("zlib").compressobj(9, 8, 31)  # gzip wrapper
    out = [co.compress(header)]
    zeros = bytes(chunk)
    left = size
    while left > 0:
        n = min(chunk, left)
        out.append(co.compress(zeros[:n]))
        left -= n
    pad = (512 - size % 512) % 512
    out.append(co.compress(bytes(pad) + bytes(1024)))
    out.append(co.flush())
    blob = b"".join(out)
    layer = Layer.__new__(Layer)
    layer.tar = None
    layer.compression, layer.blob = "gzip", blob
    layer.digest = sha256(blob)
    d = hashlib.sha256()
    d.update(header)
    left = size
    while left > 0:
        n = min(chunk, left)
        d.update(zeros[:n])
        left -= n
    d.update(bytes(pad) + bytes(1024))
    layer.diff_id = "sha256:" + d.hexdigest()
    layer.media_type, layer.size = MT_LAYER["gzip"], len(blob)
    return layer


def unique_image(nbytes=256 << 10, **kw):
    """The busybox image with one more layer of nbytes random bytes (/uniq/blob): a blob no
    store has yet, large enough to be cut in the middle."""
    t = Tar().dir("uniq").file("uniq/blob", os.urandom(nbytes)).file("uniq/id",
                                                                      os.urandom(8).hex())
    layers = busybox_layers() + [Layer(t.bytes(), "gzip")]
    cfg = dict(env=BUSYBOX_ENV, entrypoint=BUSYBOX_ENTRYPOINT, cmd=BUSYBOX_CMD,
               working_dir="/work", user="1000:1000")
    cfg.update(kw)
    return Image(layers, image_config(layers, **cfg))
