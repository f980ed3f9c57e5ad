"""The Runs page: every recorded run, newest first (the dashboard's default page)."""
