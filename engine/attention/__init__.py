"""Paged attention: a torch reference (the CPU path) and Triton kernels (the CUDA path).

Cache layout (block-major): one tensor ``[num_blocks, num_layers, 2, block_size, kv_heads, head_dim]``
so that one block's KV for every layer is one contiguous region (a transfer of n blocks is a
gather of n rows). A layer's K (or V) cache is the strided view
``kv[:, layer, 0]`` of shape ``[num_blocks, block_size, kv_heads, head_dim]``.

Both implementations share two signatures:

``paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale) -> out``
    q ``[B, num_heads, head_dim]`` (one query token per sequence), block_tables ``[B, max_blocks]``
    int32, seq_lens ``[B]`` int32 (context length including the query token, whose KV is already in
    the cache). out ``[B, num_heads, head_dim]``.

``paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale) -> out``
    q ``[T, num_heads, head_dim]``: the ragged concatenation of S sequences' new tokens (no padding),
    sequence s owning rows ``cu_seqlens_q[s]:cu_seqlens_q[s+1]``; its new tokens are the last
    ``q_len`` of its ``seq_lens[s]`` context tokens, all of whose KV is already in the cache (the
    cached prefix plus this chunk). Causal. out ``[T, num_heads, head_dim]``.
"""
