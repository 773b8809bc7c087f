"""The building blocks every layer uses: errors, pytree state helpers, seeded streams, the round's
vocabulary, models and per-client metrics."""
