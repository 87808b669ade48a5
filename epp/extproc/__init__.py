"""extproc"""
