"""Reading and writing: the bundle (writer, reader, MemoryBundle), its manifest and record schemas, OTLP decoding, workload files, and the safe output writer."""
