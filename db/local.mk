# db layer: its convenience library db/libcb_db.la, sources and tests go here.
