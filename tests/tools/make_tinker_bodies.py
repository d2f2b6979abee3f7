#!/usr/bin/env python3
"""Writes tests/data/tinker/*.bin: ForwardBackwardRequest bodies exactly as the official
SDK (tinker==0.38.0, tests/requirements.txt) encodes them, for tests/unit/test_tinker_api.c.
Run from the repository root: python3 tests/tools/make_tinker_bodies.py"""
import os

import numpy as np
import tinker
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

OUT = os.path.join(os.path.dirname(__file__), "..", "data", "tinker")


def datum(tokens, **inputs):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def write(name, data, loss_fn, config=None, forward_only=False, seq_id=1):
    inp = types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config)
    req = types.ForwardBackwardRequest(forward_backward_input=inp, model_id="sess-1:train:0", seq_id=seq_id)
    msg = forward_backward_request_to_proto(req)
    if forward_only:
        msg.forward_only = True
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(msg.SerializeToString())


def main():
    os.makedirs(OUT, exist_ok=True)
    sft = [datum([1, 2, 3, 4], target_tokens=[2, 3, 4, 5], weights=[0.0, 1.0, 1.0, 1.0]),
           datum([7, 8, 9], target_tokens=[8, 9, 10], weights=[1.0, 0.5, 0.25])]
    write("sft.bin", sft, "cross_entropy")
    write("forward.bin", sft, "cross_entropy", forward_only=True, seq_id=4)
    rl = [datum([1, 2, 3], target_tokens=[2, 3, 4], logprobs=[-1.0, -1.5, -2.0], advantages=[0.5, 0.5, 0.5])]
    write("ppo.bin", rl, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, seq_id=3)
    write("ppo_text_config.bin", rl, "ppo", {"clip_low_threshold": "x"})
    write("ppo_unknown_config.bin", rl, "ppo", {"epsilon": 0.2})
    write("unknown_loss.bin", sft, "fancy_loss")
    write("custom_loss.bin", sft, "custom")
    bad_len = sft + [datum([1, 2], target_tokens=[2, 3], weights=[1.0]), ]
    write("bad_length.bin", [sft[0], sft[1], bad_len[2]], "cross_entropy")
    wrong_dtype = [datum([1, 2], target_tokens=[2, 3],
                         weights=types.TensorData(data=[1, 1], dtype="int64", shape=[2]))]
    write("wrong_dtype.bin", wrong_dtype, "cross_entropy")
    write("big_token.bin", [datum([1, 2], target_tokens=[2, 1000], weights=[1.0, 1.0])], "cross_entropy")
    write("extra_input.bin", [datum([1, 2], target_tokens=[2, 3], weights=[1.0, 1.0],
                                    advantages=[1.0, 1.0])], "cross_entropy")
    img = types.Datum(model_input=types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=[1]),
        types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=1)]),
        loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]})
    write("image.bin", [img], "cross_entropy")
    print("wrote", sorted(os.listdir(OUT)), "tinker", tinker.__version__)


if __name__ == "__main__":
    main()
