"""examples/python/jpeg_folder.py as a user runs it: a Python Dataset over a folder of JPEGs
(PIL-written here), through flowfeed and through DataLoader, side by side, on the host."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import flowfeed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "python", "jpeg_folder.py")
sys.path.insert(0, os.path.dirname(EXAMPLE))
import jpeg_folder  # noqa: E402


def python_nodes_available():
    """Whether flowfeed.Pipeline takes a dict with a `python` node (the Python node types)."""
    config = {"pipeline": {"batch_size": 2, "epochs": 1, "prefetch_depth": 2,
                           "device": "host"},
              "nodes": [{"name": "load", "type": "python",
                         "params": {"callable": lambda i: {"x": np.zeros(2, np.uint8)},
                                    "samples": 4}},
                        {"name": "stage", "type": "host_staging"},
                        {"name": "upload", "type": "host_upload"}]}
    try:
        flowfeed.Pipeline(config)
    except TypeError as e:  # Pipeline(config) takes a path or YAML text only
        if "not dict" in str(e) or "incompatible constructor arguments" in str(e):
            return False
        raise
    except flowfeed.ConfigError as e:
        if "unknown node type 'python'" in str(e) or 'unknown node type "python"' in str(e):
            return False
        raise
    return True


needs_python_nodes = pytest.mark.skipif(
    not python_nodes_available(),
    reason="flowfeed.Pipeline does not take a dict with a python node in this build")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return jpeg_folder.make_demo(str(tmp_path_factory.mktemp("jpegs")), classes=3, per_class=10)


def test_the_dataset_gives_cropped_uint8_images_and_labels(folder):
    dataset = jpeg_folder.JpegFolder(folder)
    assert len(dataset) == 30 and dataset.classes == ["class0", "class1", "class2"]
    for index in (0, 15, 29):
        sample = dataset[index]
        assert sample["x"].dtype == np.uint8 and sample["x"].shape == (224, 224, 3)
        assert sample["y"].dtype == np.int64 and sample["y"].shape == ()
        assert int(sample["y"]) == index // 10


def test_an_empty_folder_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path}: no <class>/<file>.jpg in it")):
        jpeg_folder.JpegFolder(str(tmp_path))


def run_example(folder, loader, epochs=2, workers=2):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run(
        [sys.executable, EXAMPLE, "--root", folder, "--loader", loader, "--workers", str(workers),
         "--batch-size", "8", "--epochs", str(epochs), "--device", "cpu"],
        capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def epochs_of(output, name):
    pattern = (rf"^{re.escape(name)} epoch (\d+): (\d+) images, [\d,.]+ images/s, "
               r"mean loss ([\d.]+), images per label \[(.*)\]$")
    return [(int(e), int(n), float(loss), [int(v) for v in labels.split(", ")])
            for e, n, loss, labels in re.findall(pattern, output, re.M)]


def test_dataloader_side_sees_every_image_once_per_epoch(folder):
    output = run_example(folder, "dataloader")
    assert output.startswith("30 images, 3 classes, torchvision.transforms")
    assert [(e, n, labels) for e, n, _, labels in epochs_of(output, "DataLoader (2 workers)")] == [
        (0, 30, [10, 10, 10]), (1, 30, [10, 10, 10])]


@needs_python_nodes
def test_both_sides_see_every_image_once_per_epoch(folder):
    output = run_example(folder, "both")
    for name in ("flowfeed (concurrency 2)", "DataLoader (2 workers)"):
        epochs = epochs_of(output, name)
        assert [(e, n, labels) for e, n, _, labels in epochs] == [
            (0, 30, [10, 10, 10]), (1, 30, [10, 10, 10])], output
        assert all(np.isfinite(loss) for _, _, loss, _ in epochs)
    assert output.index("flowfeed (concurrency 2)") < output.index("DataLoader (2 workers)")


@needs_python_nodes
def test_zero_workers_is_one_flowfeed_body_and_dataloader_in_process(folder):
    output = run_example(folder, "both", epochs=1, workers=0)
    for name in ("flowfeed (concurrency 1)", "DataLoader (0 workers)"):
        assert [(e, n, labels) for e, n, _, labels in epochs_of(output, name)] == [
            (0, 30, [10, 10, 10])], output
