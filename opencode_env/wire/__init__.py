"""The wire types and the leaf modules everything may import: models, trace records, pins, version,
deadline, the access-token variable. They import nothing else of ours."""
