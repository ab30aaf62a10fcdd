#!/usr/bin/env python3
"""Writes WebDataset tar shards for the image loader tests with PIL and Python's tarfile module
(an encoder and tar writer independent of the C++ decoder), and what the tests compare against.

    make_image_shards.py OUT formats        formats.tar (+ gnu.tar): every PNG/JPEG kind; ref/*.rgb
    make_image_shards.py OUT photos N K [MIN MAX]
                                            N JPEGs, sides MIN-MAX px (48-96), in K shards
    make_image_shards.py OUT corrupt        one shard per corruption class, and mixed.tar

Each case writes OUT/manifest.json: per sample its key, label, size and the tar offsets (header
and data) of its members, so the tests can check messages that name them.
"""
import io
import json
import os
import struct
import sys
import tarfile
import zlib

import numpy as np
from PIL import Image

W, H = 40, 30  # the formats case: every image is 40x30, decoded without resizing


def picture(w, h, seed):
    """A smooth colour picture with some texture (JPEG-friendly, and no two alike)."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    fx, fy, ph = rng.uniform(0.02, 0.2, 3)
    r = 128 + 100 * np.sin(x * fx + ph)
    g = 128 + 100 * np.cos(y * fy - ph)
    b = 128 + 90 * np.sin((x + y) * (fx + fy) / 2)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))
    # tarfile sets no offsets while writing: the data ends, padded, where the archive now ends,
    # and its own header block (after any pax or long-name blocks) is just before it.
    info.offset_data = tar.offset - (len(data) + 511) // 512 * 512
    info.offset = info.offset_data - 512
    return info


def write_shard(path, samples, fmt=tarfile.PAX_FORMAT):
    """samples: list of (key, [(field, bytes), ...], extra). Returns manifest entries."""
    entries = []
    with tarfile.open(path, "w", format=fmt) as tar:
        for key, members, extra in samples:
            entry = dict(extra, key=key, members={})
            for field, data in members:
                info = add(tar, f"{key}.{field}", data)
                entry["members"][field] = {"header": info.offset, "data": info.offset_data,
                                           "size": len(data)}
            entries.append(entry)
    return entries


def formats(out):
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    base = picture(W, H, 1)
    rgb = Image.fromarray(base)
    kinds = []
    # PNGs: the reference is exact (lossless), converted as the loader documents.
    kinds.append(("png_rgb", "png", encode(rgb, "PNG"), base))
    pal = rgb.quantize(colors=50)
    kinds.append(("png_palette", "png", encode(pal, "PNG"), np.asarray(pal.convert("RGB"))))
    pal_t = pal.copy()
    pal_t.info["transparency"] = 3
    kinds.append(("png_palette_trns", "png", encode(pal_t, "PNG", transparency=3),
                  np.asarray(pal.convert("RGB"))))
    g16 = (np.arange(W * H, dtype=np.uint32).reshape(H, W) * 53 % 65536).astype(np.uint16)
    im16 = Image.fromarray(g16, mode="I;16")
    ref16 = np.repeat((g16 >> 8).astype(np.uint8)[:, :, None], 3, axis=2)
    kinds.append(("png_gray16", "png", encode(im16, "PNG"), ref16))
    alpha = np.dstack([base, (np.arange(W * H).reshape(H, W) % 256).astype(np.uint8)])
    kinds.append(("png_rgba", "png", encode(Image.fromarray(alpha, "RGBA"), "PNG"), base))
    gray = np.asarray(rgb.convert("L"))
    kinds.append(("png_gray", "png", encode(Image.fromarray(gray, "L"), "PNG"),
                  np.repeat(gray[:, :, None], 3, axis=2)))
    # JPEGs: the reference is PIL's decode (libjpeg), compared within a small tolerance.
    for key, im, kw in [("jpeg_rgb", rgb, {"quality": 95}),
                        ("jpeg_gray", Image.fromarray(gray, "L"), {"quality": 95}),
                        ("jpeg_cmyk", rgb.convert("CMYK"), {"quality": 95}),
                        ("jpeg_progressive", rgb, {"quality": 95, "progressive": True}),
                        ("jpeg_422", rgb, {"quality": 95, "subsampling": 1}),
                        ("jpeg_444", rgb, {"quality": 95, "subsampling": 0})]:
        data = encode(im, "JPEG", **kw)
        kinds.append((key, "jpg", data, np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))))
    samples = []
    for i, (key, ext, data, ref) in enumerate(kinds):
        assert ref.shape == (H, W, 3), (key, ref.shape)
        ref.astype(np.uint8).tofile(os.path.join(out, "ref", key + ".rgb"))
        samples.append((f"{i:03d}_{key}", [("cls", str(i * 7).encode()), (ext, data)],
                        {"label": i * 7, "kind": key, "width": W, "height": H}))
    manifest = write_shard(os.path.join(out, "formats.tar"), samples)
    # The same samples with GNU long names (a directory path over 100 characters).
    long_dir = "d" * 60 + "/" + "e" * 60
    gnu = [(f"{long_dir}/{k}", m, e) for k, m, e in samples[:3]]
    write_shard(os.path.join(out, "gnu.tar"), gnu, fmt=tarfile.GNU_FORMAT)
    # resize.tar: one 97x61 PNG; PIL's bilinear resize (a triangle filter, antialiased when it
    # shrinks) of the loader's center-crop box is the reference for the crop geometry.
    big = Image.fromarray(picture(97, 61, 2))
    write_shard(os.path.join(out, "resize.tar"), [("big", [("cls", b"1"), ("png", encode(big, "PNG"))],
                                                   {})])
    for name, out_size, resize in [("down", 20, 22), ("up", 40, 200)]:
        s = min(97, 61) / resize  # source pixels per output pixel
        w = h = out_size * s
        x, y = (97 - w) / 2, (61 - h) / 2
        ref = big.resize((out_size, out_size), Image.BILINEAR, box=(x, y, x + w, y + h))
        np.asarray(ref).tofile(os.path.join(out, "ref", name + ".rgb"))
    return manifest


def photos(out, count, shards, lo=48, hi=96):
    rng = np.random.RandomState(7)
    manifest = []
    per = (count + shards - 1) // shards
    for s in range(shards):
        samples = []
        for i in range(s * per, min(count, (s + 1) * per)):
            w, h = int(rng.randint(lo, hi + 1)), int(rng.randint(lo, hi + 1))
            data = encode(Image.fromarray(picture(w, h, 100 + i)), "JPEG", quality=90)
            samples.append((f"sample{i:05d}", [("cls", f"{i % 10}\n".encode()), ("jpg", data)],
                            {"label": i % 10, "width": w, "height": h}))
        manifest += write_shard(os.path.join(out, f"photos-{s:03d}.tar"), samples)
    return manifest


def good(i):
    data = encode(Image.fromarray(picture(32, 24, 500 + i)), "JPEG", quality=90)
    return (f"s{i:03d}", [("cls", str(i).encode()), ("jpg", data)], {"label": i})


def png_chunk(kind, data):
    return (struct.pack(">I", len(data)) + kind + data +
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def cut_png():
    data = encode(Image.fromarray(picture(32, 24, 502)), "PNG")
    # Chunks: signature, IHDR, IDAT..., IEND. Keep half of the first IDAT's data (CRC fixed).
    pos, out = 8, data[:8]
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IDAT":
            return out + png_chunk(b"IDAT", body[:len(body) // 2]) + png_chunk(b"IEND", b"")
        out += data[pos:pos + 12 + length]
        pos += 12 + length
    raise RuntimeError("no IDAT")


def png_bomb():
    ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
            png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + png_chunk(b"IEND", b""))


def cut_progressive():
    data = encode(Image.fromarray(picture(32, 24, 502)), "JPEG", quality=90, progressive=True)
    return data[:len(data) * 2 // 3]


def corrupt(out):
    manifest = {}
    # A sample whose .jpg holds text; one whose .jpg is empty; one without its .cls.
    bad = {"not_image": (["s002", [("cls", b"2"), ("jpg", b"hello, not a JPEG")], {"label": 2}]),
           "zero_byte": (["s002", [("cls", b"2"), ("jpg", b"")], {"label": 2}]),
           "no_label": (["s002", [("jpg", good(2)[1][1][1])], {"label": None}]),
           "bad_label": (["s002", [("cls", b"two"), ("jpg", good(2)[1][1][1])], {"label": None}]),
           # A JPEG whose entropy-coded data stops halfway (no EOI): its lower rows are missing.
           "cut_jpeg": (["s002", [("cls", b"2"), ("jpg", good(2)[1][1][1][:740])], {"label": 2}]),
           # The same cut, closed with an EOI marker as a repairing tool leaves it: libjpeg only
           # warns (premature end of data segment) and fills the rest with grey.
           "cut_jpeg_eoi": (["s002", [("cls", b"2"), ("jpg", good(2)[1][1][1][:740] + b"\xff\xd9")],
                             {"label": 2}]),
           # A progressive JPEG cut in its later scans: every row is read before any is output.
           "cut_progressive": (["s002", [("cls", b"2"), ("jpg", cut_progressive())], {"label": 2}]),
           # A PNG whose compressed rows stop halfway, closed with an IEND chunk.
           "cut_png": (["s002", [("cls", b"2"), ("png", cut_png())], {"label": 2}]),
           # A PNG header that declares 60000x60000 pixels over a few bytes of data.
           "bomb": (["s002", [("cls", b"2"), ("png", png_bomb())], {"label": 2}])}
    for name, sample in bad.items():
        samples = [good(0), good(1), tuple(sample), good(3)]
        manifest[name] = write_shard(os.path.join(out, name + ".tar"), samples)
    # all_bad.tar: four samples whose .jpg is text, so that a batch of them has no good sample.
    manifest["all_bad"] = write_shard(
        os.path.join(out, "all_bad.tar"),
        [(f"b{i}", [("cls", b"0"), ("jpg", b"hello")], {"label": 0}) for i in range(4)])
    # mixed.tar: 10 good samples and the three bad ones among them.
    samples = [good(i) for i in range(10)]
    samples.insert(3, ("bad_text", [("cls", b"0"), ("jpg", b"hello")], {"label": 0}))
    samples.insert(7, ("bad_empty", [("cls", b"0"), ("jpg", b"")], {"label": 0}))
    samples.insert(11, ("bad_nolabel", [("jpg", good(0)[1][1][1])], {"label": None}))
    manifest["mixed"] = write_shard(os.path.join(out, "mixed.tar"), samples)
    # Truncations of a good 4-sample shard: inside a header block, and inside the last member.
    entries = write_shard(os.path.join(out, "whole.tar"), [good(i) for i in range(4)])
    with open(os.path.join(out, "whole.tar"), "rb") as f:
        whole = f.read()
    last = entries[-1]["members"]["jpg"]
    with open(os.path.join(out, "truncated.tar"), "wb") as f:
        f.write(whole[:last["header"] + 100])
    with open(os.path.join(out, "cut_short.tar"), "wb") as f:
        f.write(whole[:last["data"] + last["size"] // 2])
    manifest["whole"] = entries
    # fields.tar: .json and .txt members for bytes_fields: "json:32, txt:16"; sample 1's .txt is
    # too long, sample 3 has none.
    texts = [(b'{"a": 1}', b"hello"), (b"{}", b"x" * 40), (b'{"bb": "0123456789"}', b""),
             (b"[]", None), (b"[1]", b"sixteen bytes ok")]
    samples = []
    for i, (js, txt) in enumerate(texts):
        key, members, extra = good(i)
        members = members + [("json", js)] + ([("txt", txt)] if txt is not None else [])
        samples.append((key, members, dict(extra, json=js.decode(),
                                           txt=None if txt is None else txt.decode())))
    manifest["fields"] = write_shard(os.path.join(out, "fields.tar"), samples)
    return manifest


def main():
    out, case = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if case == "formats":
        manifest = formats(out)
    elif case == "photos":
        manifest = photos(out, *(int(a) for a in sys.argv[3:]))
    elif case == "corrupt":
        manifest = corrupt(out)
    else:
        sys.exit(f"unknown case {case}")
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
