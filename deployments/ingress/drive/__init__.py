"""Server-paced streaming (`drive`): the driver of a driven session and its late-bound chunks."""
