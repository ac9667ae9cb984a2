def import_taming():
    pass
