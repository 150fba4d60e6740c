"""A stand-in for tiktoken (the harness, not the program), on PYTHONPATH outside the workspace.

tiktoken downloads the GPT-2 vocabulary at run time; no file can be downloaded here, so this
byte-level encoding replaces it: token ids 0-255 are the text's UTF-8 bytes, 50256 is
``<|endoftext|>``, the vocabulary size is GPT-2's. It is the data loading of the programs
that use it, not their computation.
"""

_EOT = "<|endoftext|>"


class Encoding:
    name = "gpt2"
    n_vocab = 50257
    eot_token = 50256

    def encode(self, text, allowed_special=frozenset(), disallowed_special="all"):
        ids = []
        for i, part in enumerate(text.split(_EOT)):
            if i:
                ids.append(self.eot_token)
            ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids):
        out, buf = [], bytearray()
        for t in ids:
            if t == self.eot_token:
                out.append(buf.decode("utf-8", "replace"))
                out.append(_EOT)
                buf = bytearray()
            else:
                buf.append(t % 256)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)


def get_encoding(name):
    return Encoding()
