"""Model building blocks, written so tensor parallelism can shard them."""
