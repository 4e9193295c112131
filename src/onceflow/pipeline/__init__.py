"""The payments and bookings pipeline on Spark (issue 4)."""
