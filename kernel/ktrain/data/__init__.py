"""Reading datasets, turning rows into token ids and labels, and cutting them into batches."""
