"""How vectors move and combine: the flat model, emulated links, codecs, the parameter servers (worker client, server, checkpoints), all-reduce, rank 0's publisher."""
