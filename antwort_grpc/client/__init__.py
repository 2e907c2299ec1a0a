"""`antwort-grpc ask` and `antwort-grpc chat`: a terminal client of ResponsesService."""
