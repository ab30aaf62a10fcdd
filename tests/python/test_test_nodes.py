"""The module holds no test node type: the fault types come from the test extension
flowfeed_testing (build/python-testing, never installed), which registers them into the module's
pipelines through the module's registration hook."""
import os
import subprocess
import sys
import textwrap

import flowfeed

CONFIG = textwrap.dedent("""\
    pipeline: { mode: pull, epochs: 1, batch_size: 4, device: host }
    nodes:
      - { name: load, type: synthetic, params: { samples: 64 } }
      - { name: boom, type: fault_transform, params: { mode: throw, at_batch: 2 } }
      - { name: upload, type: host_upload }
    """)

FAULT_TYPES = ["fault_load", "fault_staging", "fault_train", "fault_transform", "fault_upload",
               "late_write"]


def run_fresh(code):
    """Runs `code` in a new interpreter (nothing imported yet), returns its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_module_file_contains_no_test_node():
    with open(flowfeed.__file__, "rb") as f:
        module = f.read()
    for name in FAULT_TYPES[:-1]:  # (late_write is named in the test_nodes doc)
        assert name.encode() not in module, name
    assert b"injected failure" not in module


def test_without_the_extension_a_fault_type_is_an_unknown_type_and_test_nodes_says_why():
    out = run_fresh(f"""\
        import flowfeed
        config = {CONFIG!r}
        try:
            flowfeed.Pipeline(config)
        except flowfeed.ConfigError as e:
            print(e)
        try:
            flowfeed.Pipeline(config, test_nodes=True)
        except ValueError as e:
            print(e)
        """)
    assert out.splitlines() == [
        "<string>:4:25: nodes[1].type: unknown node type 'fault_transform' (known types: "
        "checksum, cuda_upload, delay, device_checksum, device_discard, device_normalize, discard, "
        "host_staging, host_upload, idx, image_folder, memory, mix, mlp, normalize, npy, "
        "pinned_staging, python, python_iterable, python_transform, random_flip, record, sleep, "
        "synthetic, tokens, webdataset)",
        "test_nodes=True: no test node types are loaded (the module has none) import "
        "flowfeed_testing first, the test extension built in the build tree's python-testing "
        "folder",
    ]


def test_the_extension_registers_the_fault_types_into_the_modules_pipelines():
    out = run_fresh(f"""\
        import flowfeed, flowfeed_testing
        print(" ".join(flowfeed_testing.node_types))
        pipeline = flowfeed.Pipeline({CONFIG!r}, test_nodes=True)
        taken = 0
        try:
            for batch in pipeline:
                taken += 1
                batch.release()
        except flowfeed.NodeError as e:
            print(e)
        # Without test_nodes=True a pipeline still has none.
        try:
            flowfeed.Pipeline({CONFIG!r})
        except flowfeed.ConfigError as e:
            print("refused")
        """)
    expected_types = FAULT_TYPES if "late_write" in out.splitlines()[0] else FAULT_TYPES[:-1]
    assert out.splitlines() == [
        " ".join(expected_types),
        "node 'boom' (fault_transform, <string>:4) batch 2 (epoch 0): "
        "fault_transform: injected failure at batch 2",
        "refused",
    ]


def test_the_extension_is_not_next_to_the_module():
    import flowfeed_testing
    assert os.path.dirname(flowfeed_testing.__file__) != os.path.dirname(flowfeed.__file__)
