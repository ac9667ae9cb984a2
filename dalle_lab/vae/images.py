"""Token ids -> pixels in [0, 1] for any image tokenizer (a leaf, so every caller can use it).

VQGANs and OpenAI's VAE decode to [0, 1]. DALLE-pytorch's DiscreteVAE decodes to its normalised space, as there
(so its `decode` matches DALLE-pytorch's), and maps back to [0, 1] in its own `decode_images`.
"""


def decode_images(vae, tokens):
    own = getattr(vae, "decode_images", None)
    return own(tokens) if own is not None else vae.decode(tokens)
