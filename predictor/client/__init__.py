"""The client side: the V2 tile client and ``histoserve embed``. Imports neither torch nor kserve."""
