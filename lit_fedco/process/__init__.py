"""Process plumbing, beneath the run: forking after the imports, the ``jobs=N`` worker pool
(pipes, a worker per core, workers that end with their launcher), the launcher's environment
checked before any process starts, the CPU allocator's setting, and the fail points the tests
kill runs at. It knows nothing of recipes, configs or federated learning."""
