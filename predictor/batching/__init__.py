"""Protocol-free dynamic batching: opaque samples in, one future per sample out."""
