#!/usr/bin/env python3
"""Writes image-folder trees for the image_folder loader tests with PIL, and what the tests expect.

    make_image_folder.py OUT

OUT/tree is a class tree: nested class directories, upper- and lower-case extensions, non-image
files, a FIFO named like an image, a file directly in the root, an empty class directory. The
expected order and labels come from torchvision's own find_classes and its walk
(sorted(os.walk(followlinks=True)), has_file_allowed_extension), special files left out.
OUT/list.csv lists the same images with other labels (a header, a comment, relative paths).
OUT/corrupt is a tree where one JPEG is damaged. OUT/manifest.json holds, per file, its path
relative to the root, label and colour (every image is one solid colour, 16x16).
"""
import json
import os
import stat
import sys

from PIL import Image
from torchvision.datasets.folder import find_classes, has_file_allowed_extension

EXT = (".jpg", ".jpeg", ".png")


def write(path, colour):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fmt = "PNG" if path.lower().endswith(".png") else "JPEG"
    Image.new("RGB", (16, 16), colour).save(path, fmt, **({"quality": 95} if fmt == "JPEG" else {}))


def torchvision_order(root):
    """torchvision.datasets.folder.make_dataset, without its refusal of empty classes and with
    special files (FIFOs) left out, as the loader documents."""
    classes, class_to_idx = find_classes(root)
    out = []
    for c in sorted(class_to_idx):
        for d, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for n in sorted(names):
                p = os.path.join(d, n)
                if has_file_allowed_extension(p, EXT) and stat.S_ISREG(os.stat(p).st_mode):
                    out.append((os.path.relpath(p, root), class_to_idx[c]))
    return classes, out


def make_tree(root, files):
    colours = {}
    for i, rel in enumerate(files):
        colour = (10 + 12 * i, 200 - 9 * i, (37 * i) % 256)
        write(os.path.join(root, rel), colour)
        colours[rel] = colour
    return colours


def main():
    out = sys.argv[1]
    tree = os.path.join(out, "tree")
    images = ["cat/a.jpg", "cat/b.PNG", "cat/sub/deep/c.JPEG", "cat/sub-x/d.png", "cat/sub/e.jpg",
              "dog/x.jpeg", "dog/w.Jpg", "zebra/y.png", "Bird/z.jpg", "Bird/q.png",
              "top.jpg"]  # the last is directly in the root: not a sample
    colours = make_tree(tree, images)
    os.makedirs(os.path.join(tree, "empty", "nested"))
    for junk in ["cat/notes.txt", "cat/image.gif", "dog/README", "empty/nested/x.txt",
                 "cat/jpg"]:
        with open(os.path.join(tree, junk), "w") as f:
            f.write("not an image\n")
    os.mkfifo(os.path.join(tree, "dog", "pipe.jpg"))
    classes, order = torchvision_order(tree)
    files = [{"path": p, "label": label, "rgb": colours[p]} for p, label in order]

    with open(os.path.join(out, "list.csv"), "w") as f:
        f.write("path,label\n# a comment\n\n")
        for i, e in enumerate(files):
            f.write(f"tree/{e['path']}, {100 + i}\n")

    corrupt = os.path.join(out, "corrupt")
    good = ["a/1.png", "a/2.jpg", "b/3.png", "b/4.jpg", "b/5.png"]
    make_tree(corrupt, good)
    with open(os.path.join(corrupt, "a", "bad.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0" + b"\x00\x10JFIF" + os.urandom(40))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"classes": classes, "files": files}, f)


if __name__ == "__main__":
    main()
